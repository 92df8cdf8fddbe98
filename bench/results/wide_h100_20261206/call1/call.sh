# call 1 (2026-12-06, twenty-sixth session): the tree's decode-attention checks; a sweep of the
# chunk lead (QE_CUDA_ATTN_LEAD, forced, now up to 900 permille) x chunks a sequence at
# long_ctx's 121 x 32K (several waves of blocks: does a chunk-major grid whose later blocks are
# shorter cut the last wave's tail?); long_ctx QEvict at the default and at the sweep's best,
# FullKV; then the other GPU tests as time allows
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 attn_decode > $R/attn_check.log 2>&1; echo "attn_decode check rc $?: $(tail -1 $R/attn_check.log) at $SECONDS s"
for lead in none 150 300 450 600 750; do
  if [ $lead = none ]; then E=""; else E="QE_CUDA_ATTN_LEAD=$lead"; fi
  env $E ATTN_CHUNKS=3,4 timeout 100 attn_decode --bench --shapes lc_q20_w8_b121 > $R/lead_$lead.log 2>&1
  echo "lead $lead rc $? at $SECONDS s"
done
python3 - $R <<'PY' | tee $OUT/sweep.txt
import json, sys, glob, os
R = sys.argv[1]; best = None
for f in sorted(glob.glob(R + '/lead_*.log')):
    lead = os.path.basename(f)[5:-4]
    for l in open(f):
        if not l.startswith('{"bench": "lc_q20'): continue
        j = json.loads(l)
        print(f"lead {lead:5s} chunks {j['chunks_per_seq']} auto {j['auto']!s:5s} ms_gpu {j['ms_gpu']:.4f} chunk-kernel ms {j['ms_chunk_kernel_only']:.4f} ms {j['ms']:.4f}")
        if lead != 'none' and (best is None or j['ms_gpu'] < best[0]): best = (j['ms_gpu'], lead, j['chunks_per_seq'])
print("BEST", best[1], best[2], best[0])
PY
read -r _ BL BC _ < <(grep BEST $OUT/sweep.txt)
echo "long_ctx: best lead $BL chunks $BC at $SECONDS s"
timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 > $R/lc_q.json 2> $R/lc_q.err
echo "qevict default rc $? at $SECONDS s: $(tail -c 300 $R/lc_q.json)"
QE_CUDA_ATTN_LEAD=$BL QE_CUDA_ATTN_SPLIT=$BC timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 > $R/lc_qlead.json 2> $R/lc_qlead.err
echo "qevict lead $BL split $BC rc $? at $SECONDS s: $(tail -c 300 $R/lc_qlead.json)"
timeout 150 long_ctx --policy full --budget 0.2 --ctx 32768 --new 200 > $R/lc_f.json 2> $R/lc_f.err
echo "full rc $? at $SECONDS s: $(tail -c 300 $R/lc_f.json)"
python3 - $R <<'PY' | tee $OUT/lc.txt
import json, sys
R = sys.argv[1]
def ld(n):
    try: return json.loads(open(f'{R}/{n}.json').read().strip().splitlines()[-1])
    except Exception: return None
f = ld('lc_f')
for n in ('lc_q', 'lc_qlead', 'lc_f'):
    j = ld(n)
    if not j: print(n, 'unreadable'); continue
    r = j['tokens_per_s'] / f['tokens_per_s'] if f else 0
    print(f"{n:9s} seqs {j['sequences']:4d} step {j['step_ms']:8.3f} ms tok/s {j['tokens_per_s']:8.1f} route {j.get('route_ms_per_step', -1):.3f} x full {r:.3f}")
PY
for t in test_model_graph test_kv_gpu test_kc_quant; do
  [ $SECONDS -gt 520 ] && { echo "$t: no time left"; continue; }
  timeout 60 $t > $R/$t.log 2>&1; echo "$t rc $?: $(tail -1 $R/$t.log) at $SECONDS s"
done
(cd $OUT && tar czf r.tgz --remove-files r)
