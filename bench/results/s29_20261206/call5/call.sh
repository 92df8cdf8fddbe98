# Twenty-ninth session, call 5: the GPU checks of the tree (a244502: the audits' fixes, pyramidkv's
# capped layer budgets on the GPU, attn_block): test_model_graph, test_kv_gpu (with
# check_pyramid_full), test_kc_quant, attn_decode's checks, test_kern_cuda, attn_block's checks,
# compute-sanitizer memcheck and racecheck over test_kc_quant, test_kv_gpu --small, attn_decode
# --small and attn_block, then tests/kernels/serve_gpu.sh on stories260K (the GPU refusals).
# Carry carry/pack and carry/models (stories260K and its golden outputs).
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
export QE_SHARED_MODELS=$(pwd)/carry/models
LC=0 ROUNDS=0 SANITIZE=1 SAN_RUNS="test_kc_quant,test_kv_gpu --small,attn_decode --small,attn_block" \
  TAG=checks bash bench/gpu_longctx_ab.sh 2>&1 | tail -25
source bench/device_unpack.sh
cd $OUT
timeout 150 test_kern_cuda > kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 kern_cuda.log | cut -c1-160)"
timeout 100 attn_block > attn_block.log 2>&1; echo "attn_block rc $?: $(tail -1 attn_block.log)"
tar -xzOf checks.tgz checks/test_kv_gpu.log | grep -h "pyramidkv at budget 1"
cd - >/dev/null
QEVICT=$(command -v qevict) timeout 200 tests/kernels/serve_gpu.sh carry/models/stories260K.gguf \
  > $OUT/serve_gpu.log 2>&1
echo "serve_gpu rc $?"; tail -5 $OUT/serve_gpu.log
echo "done at $SECONDS s"
