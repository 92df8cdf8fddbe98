# Twenty-ninth session, call 7: where the last 1-3% to cuDNN at 32K might be. attn_decode's read
# rooflines of the FullKV 32K shapes (--pipes: a plain stream of the same bytes, and the chunk
# kernel's pattern, each KV head's 256-byte slice of every 2 KiB token row), and attn_block at
# B=32 32K with 2 and 3 chunks a sequence (FB_CHUNKS). Carry carry/pack.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
timeout 200 attn_decode --bench --pipes --shapes full_b8_s32768,full_b32_s32768 > $OUT/pipes.log 2>&1
echo "attn_decode --pipes rc $?"
grep -E '"bench": "(copy|read|full_b8_s32768_read|full_b32_s32768_read)|_read' $OUT/pipes.log | cut -c1-260
for c in 2 3; do
  FB_CHUNKS=$c timeout 100 attn_block --bench --rounds 3 --shapes b32_s32768 > $OUT/block_c$c.log 2>&1
  echo "chunks $c rc $?"; grep -v '^{' $OUT/block_c$c.log | grep -v ^variant
done
echo "done at $SECONDS s"
