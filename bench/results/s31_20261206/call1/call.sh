# Thirty-first session (2026-12-06), call 1: the thirtieth session's owed call 3 (the 256-byte L2
# prefetch default of the decode attention's copies, KCA_L2HINT): GPU checks (test_kv_gpu,
# attn_decode and the -DKCA_L2HINT=0 build), the tiered 32K kernel A/B, long_ctx at 32K (200 new
# tokens) QEvict 20% with both builds and FullKV with the new one. On an H200 also the decode
# attention table (FullKV B=32 S=1280, B=8 32K, B=32 32K; tiered 20% w8 B=8 and B=32 32K) with
# torch SDPA cuDNN queued the same way, two rounds (the twenty-eighth session's owed figures).
# Carry carry/pack: bench/device_pack.sh's pack less qevict, test_kern_cuda, attn_block,
# test_model_graph and test_kc_quant, plus attn_decode_base and long_ctx_base (-DKCA_L2HINT=0).
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
ATTN_SHAPES=abs_tiered20_w8_b8_s32768,abs_tiered20_w8_b32_s32768 \
  LC=0 ROUNDS=1 NEW=200 BINS="long_ctx_base long_ctx" POLS=qevict FULL_ONCE=1 TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "long_ctx part done at $SECONDS s"
case "$G" in *H200*) ;; *) echo "not an H200: no peer table"; exit 0 ;; esac
bash bench/gpu_peer_table.sh
echo "done at $SECONDS s"
