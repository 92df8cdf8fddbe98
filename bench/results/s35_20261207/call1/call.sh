# Thirty-fifth session (2026-12-07), call 1: the owed H200 figures (the thirty-second session's
# call 2, bench/results/s32_20261206/call2/call.sh), then a second round of long_ctx while the
# call has time. Carry carry/pack (bench/device_pack.sh's pack of the tree, less the binaries not
# run here, plus long_ctx_base built with -DKCA_L2HINT=0). On an H200 only (other cards stop).
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$G" in *H200*) ;; *) echo "not an H200 ($G): nothing to run"; exit 0 ;; esac
STEPS="lc base peer" bash bench/results/s32_20261206/call2/call.sh
if (( SECONDS < 280 )); then
  export PACK=carry/pack
  CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc_r2 \
    bash bench/gpu_longctx_ab.sh
fi
echo "call done at $SECONDS s"
