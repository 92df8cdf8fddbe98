# Thirty-second session (2026-12-06), call 3: call 2 without its last step (long_ctx_base), for
# the device time left (call 1 ran on an H100, call 2 too). Carry carry/pack (call 1's).
# On an H200 only (other cards stop at once): long_ctx at 32K, 200 new, QEvict 20% then FullKV;
# the decode-attention table with torch SDPA cuDNN queued alike, two rounds.
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "long_ctx done at $SECONDS s"
bash bench/gpu_peer_table.sh
echo "done at $SECONDS s"
