# call 1 (2026-12-05, twenty-fifth session, H200): HEAD's attn_decode checks (in gpu_longctx_ab.sh),
# (prepared in the twenty-fourth session; no device was lent then)
# the routing pass by stage (QE_ROUTE_PROF=1, the tree's default), the long_ctx bisection
# (QE_CUDA_FUSE_PROJ=0: the old routing decisions), FullKV once
export PACK=carry/revs
source bench/device_unpack.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
QE_ROUTE_PROF=1 timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 \
  > $OUT/prof_q.json 2> $OUT/prof_q.err
echo "profiled qevict rc $? at $SECONDS s"; grep "route prof" $OUT/prof_q.err; tail -c 400 $OUT/prof_q.json
QE_CUDA_FUSE_PROJ=0 POLS=qevict NEW=200 ROUNDS=1 LC=0 \
  BINS="long_ctx_2f011be long_ctx_9af7e15 long_ctx_77c7263 long_ctx_d20d54c long_ctx" \
  bash bench/gpu_longctx_ab.sh
echo "at $SECONDS s"
timeout 120 long_ctx --policy full --budget 0.2 --ctx 32768 --new 200 > $OUT/full.json 2> $OUT/full.err
echo "full rc $? at $SECONDS s"; tail -c 300 $OUT/full.json
