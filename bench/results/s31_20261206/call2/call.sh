# Thirty-first session (2026-12-06), call 2: the H200 figures of the tree (7ad1ac0's GPU code: the
# wide rule and the 256-byte L2 prefetch as defaults). On an H200 only (other cards stop at once):
# long_ctx at 32K, 200 new tokens, QEvict 20% then FullKV; the decode-attention table (FullKV
# B=32 S=1280, B=8 32K, B=32 32K; tiered 20% w8 B=8 and B=32 32K) with torch SDPA cuDNN queued the
# same way, two rounds; then long_ctx QEvict of the -DKCA_L2HINT=0 build (long_ctx_base).
# Carry carry/pack (as call 1's, less attn_decode_base).
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "long_ctx done at $SECONDS s"
bash bench/gpu_peer_table.sh
echo "peer table done at $SECONDS s"
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx_base POLS=qevict TAG=lc_base bash bench/gpu_longctx_ab.sh
echo "done at $SECONDS s"
