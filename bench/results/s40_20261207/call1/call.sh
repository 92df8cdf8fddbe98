# Fortieth session (2026-12-07), call 1, on any card: the daemon on a GPU over a model the GPU
# caches take. tests/kernels/serve_gpu.sh had run on stories260K alone since 2026-11-29 (head_dim 8:
# FullKV in kv_full, every tiered request refused), as SmolLM2 is over what a call carries; now
# on rand_gguf's random model of head_dim 64 (4/2 heads, 2 layers): FullKV in bf16 pages with
# decode graphs, QEvict 30% and SnapKV on the GPU tiered cache, under a tenant quota, and the new
# load check of --pool-bytes against the free device memory; again with --pool-bytes 40% (a
# share of the free memory). Then test_kv_gpu and
# test_model_graph of this tree. Carry carry/pack2 (bench/device_pack.sh with
# PACK_DIR=carry/pack2 PACK_BINS="cli/qevict tests/unit/rand_gguf tests/kernels/test_kv_gpu
# tests/kernels/test_model_graph").
export PACK=${PACK:-carry/pack2}
source bench/device_unpack.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
O=${OUT:-/tmp/out}/s40c1
mkdir -p "$O"
RAND_GGUF=$QE_DEV/bin/rand_gguf timeout 300 bash tests/kernels/serve_gpu.sh rand \
  "$QE_DEV/bin/qevict" >"$O/serve_gpu.log" 2>&1
echo "serve_gpu rc $?"
grep -vE '^  (request|1[0-9]{15})' "$O/serve_gpu.log" | tail -25
# (the second run: --pool-bytes 40%, a share of the device memory free after the model loads)
SERVE_GPU_POOL=40% RAND_GGUF=$QE_DEV/bin/rand_gguf timeout 300 bash tests/kernels/serve_gpu.sh \
  rand "$QE_DEV/bin/qevict" >"$O/serve_gpu_share.log" 2>&1
echo "serve_gpu --pool-bytes 40% rc $?"
grep -E 'pool-bytes|PASS|FAIL|done in' "$O/serve_gpu_share.log" | cut -c1-300
for t in test_kv_gpu test_model_graph; do
  timeout 240 "$t" >"$O/$t.log" 2>&1
  echo "$t rc $?: $(tail -1 "$O/$t.log")"
done
echo "call done at $SECONDS s"
