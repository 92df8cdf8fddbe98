# Twenty-ninth session, call 6: tests/kernels/serve_gpu.sh on stories260K with its guards for a
# model the GPU kernels do not take (call 5 had failed only those checks); then, on an H200 only,
# the owed figures of bench/results/s28_20261206/call1/call.sh (long_ctx at 32K, QEvict 20% and
# FullKV; the decode-attention table with cuDNN queued alike). Carry carry/pack, carry/models.
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
source bench/device_unpack.sh
QEVICT=$(command -v qevict) timeout 150 tests/kernels/serve_gpu.sh carry/models/stories260K.gguf \
  > $OUT/serve_gpu.log 2>&1
echo "serve_gpu rc $?"; grep -E "^serve_gpu|FAIL" $OUT/serve_gpu.log
case "$G" in *H200*) bash bench/results/s28_20261206/call1/call.sh ;; esac
echo "done at $SECONDS s"
