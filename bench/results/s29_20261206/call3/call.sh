# Twenty-ninth session, call 3: attn_block with K and V as copy groups of their own (t64s2kv,
# t64s3kv: the scores wait for K only, the P V for V) beside t64s2 and t64s3: checks, the bench
# (automatic chunks), then B=8 32K at 4 and 8 chunks a sequence (FB_CHUNKS), and torch SDPA
# cuDNN queued on the same shapes. Carry carry/pack.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
timeout 200 attn_block > $OUT/check.log 2>&1
echo "attn_block check rc $?"
grep -E "^variant|FAIL|failures" $OUT/check.log | head -30
timeout 240 attn_block --bench --rounds 5 > $OUT/bench.log 2>&1
echo "attn_block bench rc $?"
grep -v '^{' $OUT/bench.log | grep -v ^variant
for c in 4 8; do
  FB_CHUNKS=$c timeout 100 attn_block --bench --rounds 3 --shapes b8_ > $OUT/bench_c$c.log 2>&1
  echo "chunks $c rc $?"; grep -v '^{' $OUT/bench_c$c.log | grep -v ^variant
done
timeout 100 python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > $OUT/sdpa.log 2>&1
grep -h 'cudnn' $OUT/sdpa.log | grep -o '"batch": [0-9]*, "seq": [0-9]*\|"ms_gpu": [0-9.]*' | paste - -
echo "done at $SECONDS s"
