# call 5 (2026-12-05, twenty-third session): long_ctx QEvict 20% at 32K, the seventeenth session's
# final tree (carry/old/long_ctx: 2f011be, 3.039x on an H200) against this tree, and this tree
# with its later fusions off one at a time (QE_CUDA_FUSE_PROJ=0; QE_CUDA_FUSE_ADD=0 +
# QE_CUDA_FUSE_BF16=0), to find what made the H200's step 48.4-48.8 ms from 47.0
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R; O=/tmp/qe/old; mkdir -p $O
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" carry/old/long_ctx.xz $O/long_ctx
chmod +x $O/long_ctx
nvidia-smi --query-gpu=name --format=csv,noheader
lc() { # NAME BIN POLICY ENV...
  local n=$1 b=$2 pol=$3; shift 3
  env "$@" timeout 110 $b --policy $pol --budget 0.2 --ctx 32768 --new 200 > $R/$n.json 2> $R/$n.err
  python3 -c "
import json; j=json.load(open('$R/$n.json'))
print('%-22s %4d seqs step %8.3f ms %8.1f tok/s route %.3f ms fill %.1f s promo %d demo %d quant %d evict %d' % ('$n', j['sequences'], j['step_ms'], j['tokens_per_s'], j['route_ms_per_step'], j['fill_s'], j.get('promotions',0), j.get('demotions',0), j.get('quantizations',0), j.get('evictions',0)))" 2>/dev/null || echo "$n failed: $(tail -2 $R/$n.err)"
}
N=/tmp/qe/bin/long_ctx
lc old_q1 $O/long_ctx qevict QE_X=1
lc new_q1 $N qevict QE_X=1
lc new_q_noproj $N qevict QE_CUDA_FUSE_PROJ=0
lc new_q_noadd $N qevict QE_CUDA_FUSE_ADD=0 QE_CUDA_FUSE_BF16=0
echo "== $SECONDS s"
[ $SECONDS -lt 330 ] && lc old_q2 $O/long_ctx qevict QE_X=1
[ $SECONDS -lt 390 ] && lc new_q2 $N qevict QE_X=1
[ $SECONDS -lt 450 ] && lc old_f $O/long_ctx full QE_X=1
[ $SECONDS -lt 500 ] && lc new_f $N full QE_X=1
echo "== $SECONDS s"
(cd $OUT && tar czf r.tgz --remove-files r)
