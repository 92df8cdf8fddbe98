# Forty-first session (2026-12-07), call 1, on any card: the daemon on a GPU over rand_gguf's
# model (the fortieth session's call 1: tests/kernels/serve_gpu.sh rand at 512M and 40%,
# test_kv_gpu, test_model_graph) on this session's tree:
# the fortieth's last commits (the free-memory query in a function of its own, not run on a GPU)
# and the GPU workers' default pool (40% of the free device memory without --pool-bytes; the
# script checks a worker alone, and the second run passes no --pool-bytes to serve). Then a
# worker alone with --pool-bytes 60%, whose FullKV arena takes over half the free memory: it must
# warn at its load that one policy configuration runs at a time (the fortieth session's call 2,
# not run). Carry carry/pack2 (bench/device_pack.sh with
# PACK_DIR=carry/pack2 PACK_BINS="cli/qevict tests/unit/rand_gguf tests/kernels/test_kv_gpu
# tests/kernels/test_model_graph").
export PACK=${PACK:-carry/pack2}
bash bench/results/s40_20261207/call1/call.sh # (512M, then 40%; test_kv_gpu, test_model_graph)
source bench/device_unpack.sh || exit 1
O=${OUT:-/tmp/out}/s41c1
mkdir -p "$O"
SERVE_GPU_POOL=default RAND_GGUF=$QE_DEV/bin/rand_gguf timeout 300 bash tests/kernels/serve_gpu.sh \
  rand "$QE_DEV/bin/qevict" >"$O/serve_gpu_default.log" 2>&1
echo "serve_gpu, no --pool-bytes: rc $?"
grep -E 'pool-bytes|PASS|FAIL|done in' "$O/serve_gpu_default.log" | cut -c1-300
"$QE_DEV/bin/rand_gguf" "$O/rand.gguf" --ctx 4096 --heads 4 --kv 2 --layers 2
QEVICT_LOG=info timeout 20 "$QE_DEV/bin/qevict" worker --model "$O/rand.gguf" --device 0 \
  --pool-bytes 60% --scheduler "unix:$O/none.sock" >"$O/worker60.log" 2>&1
grep -E 'pool-bytes|arena' "$O/worker60.log" | head -4 | cut -c1-300
if grep -q 'one policy configuration (FullKV, or one tiered policy and window) can run at a time' \
  "$O/worker60.log"; then echo "worker --pool-bytes 60%: warned: PASS"; else
  echo "worker --pool-bytes 60%: no warning: FAIL"; fi
echo "call done at $SECONDS s"
