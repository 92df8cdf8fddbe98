# Twenty-ninth session (2026-12-06), call 1: the block-wide FullKV experiment (attn_block, the
# tree's 12b74a6 plus tests/kernels/attn_block.cu): its checks against the fp64 reference, then
# its bench against the tree's kernel (five variants, five rounds), the tree's attn_decode FullKV
# shapes and torch SDPA cuDNN queued on the same shapes. Carry carry/pack (bench/device_pack.sh).
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
timeout 200 attn_block > $OUT/check.log 2>&1
echo "attn_block check rc $?"
grep -E "^variant|FAIL|failures" $OUT/check.log | head -30
timeout 240 attn_block --bench --rounds 5 > $OUT/bench.log 2>&1
echo "attn_block bench rc $?"
grep -v '^{' $OUT/bench.log
grep '^{' $OUT/bench.log | grep -o '"bench": "[a-z0-9_]*", "variant": "[a-z0-9]*".*"err_vs_tree": [-0-9.e+]*'
if [[ $SECONDS -lt 420 ]]; then
  timeout 100 python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > $OUT/sdpa.log 2>&1
  grep -h 'ms_gpu' $OUT/sdpa.log | cut -c1-200
fi
echo "done at $SECONDS s"
