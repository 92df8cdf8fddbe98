# Thirtieth session, call 1: is cuDNN's lead at 32K its reads' order or L2? (1) the read
# patterns of the FullKV 32K shapes in GPU time: a plain stream, the kernels' pattern (each KV
# head's 256-byte slice of every 2 KiB token row) and the same walk over a head-major layout
# (torch's [B, H_kv, S, D], what cuDNN reads); (2) the tree's FullKV call (no masses) and torch
# SDPA cuDNN, both queued, with and without an L2 flush before each call (ATTN_FLUSH=1,
# sdpa_queued.py --flush), two rounds alternating; (3) attn_block flushed. Carry carry/pack.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
for f in 0 1; do
  ATTN_FLUSH=$f timeout 200 attn_decode --bench --pipes --shapes full_b8_s32768,full_b32_s32768 \
    > $OUT/pipes_f$f.log 2>&1
  echo "pipes flush $f rc $?"; grep -h read_patterns $OUT/pipes_f$f.log
done
S=full_b32_s1280,full_b8_s32768,full_b32_s32768
for r in 1 2; do
  for f in 0 1; do
    ATTN_FLUSH=$f timeout 200 attn_decode --bench --shapes $S > $OUT/attn_r${r}_f$f.log 2>&1
    echo "attn r$r flush $f rc $?"
    grep -h no_masses $OUT/attn_r${r}_f$f.log | grep -o '"bench": "[a-z0-9_]*"\|"ms_gpu": [0-9.]*' | paste - -
    fl=""; [ $f = 1 ] && fl=--flush
    timeout 150 python3 bench/sdpa_queued.py $fl --shapes 32x1280,8x32768,32x32768 \
      > $OUT/sdpa_r${r}_f$f.log 2>&1
    echo "sdpa r$r flush $f rc $?"
    grep -h cudnn $OUT/sdpa_r${r}_f$f.log | grep -o '"batch": [0-9]*, "seq": [0-9]*\|"ms_gpu": [0-9.]*' | paste - -
  done
done
ATTN_FLUSH=1 timeout 200 attn_block --bench --rounds 3 > $OUT/block_f1.log 2>&1
echo "attn_block flush rc $?"; grep -v '^{' $OUT/block_f1.log | grep -v ^variant
echo "done at $SECONDS s"
