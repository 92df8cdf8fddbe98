# call 1 (2026-12-05, twentieth session): the tree's checks and the attention record
export PACK=carry/p1; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
SHAPES="full_b,abs_tiered20_w8" X=/tmp/qe/bin/attn_decode OUT=$OUT/attn timeout 420 sh bench/gpu_attn.sh 2>&1 | tail -40
cd $OUT
timeout 100 test_kern_cuda > kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 kern_cuda.log | cut -c1-200)"
grep -iE "fail|mismatch" kern_cuda.log | head -5
timeout 150 test_kv_gpu --small > kv_gpu.log 2>&1; echo "test_kv_gpu --small rc $?: $(tail -1 kv_gpu.log | cut -c1-160), $(grep -c FAIL kv_gpu.log) FAIL"
tar czf tests.tgz --remove-files kern_cuda.log kv_gpu.log
