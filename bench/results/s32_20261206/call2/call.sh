# Thirty-second session (2026-12-06), call 2: call 1's H200 half alone (call 1 ran on an H100 and
# did its other half, the prefill prefetch A/B); also the thirty-first session's owed call 2.
# Carry carry/pack (call 1's, without carry/var). On an H200 only (other cards stop at once),
# the steps named in $STEPS (default all three, in this order):
#   lc    long_ctx at 32K, 200 new, QEvict 20% then FullKV
#   peer  the decode-attention table with torch SDPA cuDNN queued alike, two rounds
#   base  long_ctx QEvict without the L2 prefetch (long_ctx_base, -DKCA_L2HINT=0)
export PACK=carry/pack
STEPS=${STEPS:-lc peer base}
G=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
lc() { # BIN POLICIES TAG
  CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=$1 POLS=$2 TAG=$3 bash bench/gpu_longctx_ab.sh
}
for s in $STEPS; do
  case $s in
    lc) lc long_ctx "qevict full" lc ;;
    peer) bash bench/gpu_peer_table.sh ;;
    base) lc long_ctx_base qevict lc_base ;;
  esac
  echo "$s done at $SECONDS s"
done
