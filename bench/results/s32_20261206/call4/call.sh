# Thirty-second session (2026-12-06), call 4: the least of the owed H200 figures, for the device
# time left: long_ctx at 32K, 200 new tokens, QEvict 20% then FullKV (the tokens/s target), the
# tree of 6145b0e (call 1's pack, carry carry/pack). On an H200 only (other cards stop at once).
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "done at $SECONDS s"
