# Twenty-ninth session, call 9: tests/kernels/serve_gpu.sh on stories260K with 2/5 of its context
# in new tokens (call 8's runs: 256 tokens ended before a sample saw the request that waits for
# the quota; 1,200 did not fit the context). Carry carry/pack, carry/models.
export PACK=carry/pack
nvidia-smi --query-gpu=name --format=csv,noheader
source bench/device_unpack.sh
QEVICT=$(command -v qevict) timeout 150 tests/kernels/serve_gpu.sh carry/models/stories260K.gguf \
  > $OUT/serve_gpu.log 2>&1
echo "serve_gpu rc $?"; grep -E "^serve_gpu|FAIL" $OUT/serve_gpu.log
