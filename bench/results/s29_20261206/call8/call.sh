# Twenty-ninth session, call 8 (run twice: the second time after test_kv_gpu's 9/3 cases at budget
# 0.2 and serve_gpu.sh's 2/5 of the context in new tokens on a model the kernels do not take): the GPU checks after the GPU cache's bounds follow kv_tiered's rule
# (73c7f95: kv_slot_regions, kv_layer_hist shared): test_kv_gpu (its new check_fullkv_slot and
# check_pyramid_full), test_model_graph, test_kc_quant, compute-sanitizer memcheck over
# test_kv_gpu --small, and serve_gpu.sh on stories260K. Carry carry/pack, carry/models.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
cd $OUT
for t in test_kv_gpu test_model_graph test_kc_quant; do
  timeout 200 $t > $t.log 2>&1; echo "$t rc $?: $(tail -1 $t.log | cut -c1-200)"
  grep -E "FAIL" $t.log | head -3
done
grep -hE "kv_gpu slot at FullKV|pyramidkv at budget 1" test_kv_gpu.log | cut -c1-330
timeout 240 compute-sanitizer --tool memcheck test_kv_gpu --small > san_kv_gpu.log 2>&1
echo "memcheck test_kv_gpu --small rc $?: $(grep 'ERROR SUMMARY' san_kv_gpu.log | tail -1)"
cd - >/dev/null
QEVICT=$(command -v qevict) timeout 150 tests/kernels/serve_gpu.sh carry/models/stories260K.gguf \
  > $OUT/serve_gpu.log 2>&1
echo "serve_gpu rc $?"; grep -E "^serve_gpu|FAIL" $OUT/serve_gpu.log
echo "done at $SECONDS s"
