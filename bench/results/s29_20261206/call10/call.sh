# Twenty-ninth session, call 10: long_ctx at 32K on an H100 with the tree's GPU bounds (73c7f95:
# the sink's windows no longer counted twice in a slot's FullKV bytes), QEvict 20% then FullKV,
# 200 new tokens (bench/gpu_longctx_ab.sh). Carry carry/pack.
export PACK=carry/pack
CHECKS=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc bash bench/gpu_longctx_ab.sh
echo "done at $SECONDS s"
