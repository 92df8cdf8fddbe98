# Twenty-eighth session (2026-12-06), call 1: the owed H200 figures of the tree (b7b5372, whose
# GPU code is 24d0315's with the wide rule as the default). On an H200: long_ctx at 32K, 200 new
# tokens, QEvict 20% then FullKV (bench/gpu_longctx_ab.sh), then the decode-attention table
# (FullKV B=32 S=1280, B=8 32K, B=32 32K; tiered 20% w8 B=8 and B=32 32K) with torch SDPA cuDNN
# queued the same way, two rounds. On another card it stops (the H100's figures are measured).
# Carry carry/pack (bench/device_pack.sh).
export PACK=${PACK:-carry/pack}
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
CHECKS=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc bash bench/gpu_longctx_ab.sh
bash bench/gpu_peer_table.sh
echo "done at $SECONDS s"
