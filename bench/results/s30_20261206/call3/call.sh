# Thirtieth session, call 3: the copies' L2 prefetch of 256 bytes as the default (KCA_L2HINT 256)
# against the tree before it (built with -DKCA_L2HINT=0, packed as long_ctx_base and
# attn_decode_base): the GPU checks (test_kv_gpu, attn_decode
# and its variant), the kernel A/B on the tiered 32K shapes (call 2 had FullKV level), then long_ctx
# at 32K (200 new tokens), QEvict 20% with both builds and FullKV with the new one. On an H200,
# the twenty-eighth session's owed call first. Carry carry/pack (bench/device_pack.sh, less
# qevict, test_kern_cuda, attn_block, test_model_graph and test_kc_quant, plus the two base
# binaries: device time).
export PACK=carry/pack
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) bash bench/results/s28_20261206/call1/call.sh ;;
esac
ATTN_SHAPES=abs_tiered20_w8_b8_s32768,abs_tiered20_w8_b32_s32768 \
  LC=0 ROUNDS=1 NEW=200 BINS="long_ctx_base long_ctx" POLS=qevict FULL_ONCE=1 TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "done at $SECONDS s"
