# call 3 (2026-12-06, twenty-sixth session): the wide tiered chunking (KC_ATTN_SPLIT_WIDE 4
# chunks, lead 300 permille, chunk-major) as the default: checks (with a wide case), the kernel
# at long_ctx's 121 x 32K against the old rule (QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0), two
# rounds; long_ctx QEvict new / old, FullKV; test_model_graph, test_kv_gpu
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r3; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 attn_decode > $R/attn_check.log 2>&1; echo "attn_decode check rc $?: $(tail -1 $R/attn_check.log) at $SECONDS s"
grep -E 'FAIL|chunking past|max chunks|wide' $R/attn_check.log | head -8
SH=lc_q20_w8_b121_s32768,abs_tiered20_w8_b32_s32768
for r in 1 2; do
  ATTN_CHUNKS=1 timeout 100 attn_decode --bench --shapes $SH > $R/new_$r.log 2>&1
  QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 ATTN_CHUNKS=1 timeout 100 attn_decode --bench --shapes $SH > $R/old_$r.log 2>&1
done
python3 - $R <<'PY' | tee $OUT/ab.txt
import json, sys
R = sys.argv[1]
def pick(f, sh):
    for l in open(f):
        if l.startswith('{"bench": "%s"' % sh):
            j = json.loads(l)
            if j.get('auto'): return j['ms_gpu'], j['chunks_per_seq']
    return None, None
for r in (1, 2):
    for sh in ('lc_q20_w8_b121_s32768', 'abs_tiered20_w8_b32_s32768'):
        n, nc = pick(f'{R}/new_{r}.log', sh); o, oc = pick(f'{R}/old_{r}.log', sh)
        if n and o: print(f"round {r} {sh:28s} new {n:.4f} ({nc} chunks)  old {o:.4f} ({oc} chunks)  new/old {n / o:.3f}")
PY
echo "at $SECONDS s"
timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 > $R/lc_q.json 2> $R/lc_q.err; echo "qevict new rc $? at $SECONDS s"
timeout 150 long_ctx --policy full --budget 0.2 --ctx 32768 --new 200 > $R/lc_f.json 2> $R/lc_f.err; echo "full rc $? at $SECONDS s"
[ $SECONDS -lt 420 ] && { QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 > $R/lc_qold.json 2> $R/lc_qold.err; echo "qevict old rc $? at $SECONDS s"; }
python3 - $R <<'PY' | tee $OUT/lc.txt
import json, sys
R = sys.argv[1]
def ld(n):
    try: return json.loads(open(f'{R}/{n}.json').read().strip().splitlines()[-1])
    except Exception: return None
f = ld('lc_f')
for n in ('lc_q', 'lc_qold', 'lc_f'):
    j = ld(n)
    if not j: print(n, 'unreadable'); continue
    r = j['tokens_per_s'] / f['tokens_per_s'] if f else 0
    print(f"{n:9s} seqs {j['sequences']:4d} step {j['step_ms']:8.3f} ms tok/s {j['tokens_per_s']:8.1f} route {j.get('route_ms_per_step', -1):.3f} promotions {j.get('promotions', 0)} x full {r:.3f}")
PY
for t in test_model_graph test_kv_gpu; do
  [ $SECONDS -gt 500 ] && { echo "$t: no time left"; continue; }
  timeout 90 $t > $R/$t.log 2>&1; echo "$t rc $?: $(tail -1 $R/$t.log) at $SECONDS s"
done
(cd $OUT && tar czf r3.tgz --remove-files r3)
