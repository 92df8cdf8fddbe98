source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
cd $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 100 attn_decode > chk.log 2>&1; echo "attn_decode check rc $?: $(tail -1 chk.log)"; grep FAIL chk.log | head -3
for T in memcheck racecheck; do
  timeout 80 compute-sanitizer --tool $T attn_decode --only "abs gqa4 d128 w8 int2 pairs" > $T.log 2>&1; echo "$T rc $?: $(grep -c '^ok' $T.log) ok, $(tail -1 $T.log)"
done
timeout 150 test_model_graph > model_graph.log 2>&1; echo "test_model_graph rc $?: $(tail -1 model_graph.log | cut -c1-160)"; grep -i fail model_graph.log | head -3
S="full_b8_s32768,abs_tiered20_w8_b8,full_b32_s32768,abs_tiered20_w8_b32_s32768,lc_q20_w8_b121"
for r in 1 2; do for M in def 0; do
  if [ $M = def ]; then E="QE_X=0"; else E="QE_CUDA_ATTN_SPREAD=0"; fi
  env $E ATTN_CHUNKS=4 timeout 120 attn_decode --bench --shapes "$S" > b_${M}_$r.log 2>&1
  echo "bench spread $M r$r rc $?"
done; done
for L in 50 100 125; do
  QE_CUDA_ATTN_LEAD=$L ATTN_CHUNKS=4 timeout 60 attn_decode --bench --shapes abs_tiered20_w8_b8 > b_L${L}_1.log 2>&1; echo "lead $L rc $?"
done
ATTN_CHUNKS=4 ATTN_FIXED=6 timeout 60 attn_decode --bench --shapes abs_tiered20_w8_b8 > fx.log 2>&1; grep '_fixed' fx.log | cut -c1-300
python3 - <<'PY'
import json, glob, statistics as st
rows = {}
for f in sorted(glob.glob("b_*_*.log")):
    v = f[2:].rsplit("_", 1)[0]
    for l in open(f):
        try: d = json.loads(l)
        except Exception: continue
        if d.get("auto") and "ms_gpu" in d: rows.setdefault((d["bench"], v), []).append(d["ms_gpu"])
for (b, v), xs in sorted(rows.items()):
    print(f"{b:28s} {v:5s} gpu ms {' '.join('%.4f' % x for x in xs)}  median {st.median(xs):.4f}")
f8 = st.median(rows[("full_b8_s32768", "def")] + rows[("full_b8_s32768", "0")])
f32 = st.median(rows[("full_b32_s32768", "def")] + rows[("full_b32_s32768", "0")])
for v in ("def", "0", "L50", "L100", "L125"):
    if ("abs_tiered20_w8_b8_s32768", v) in rows: print("ratio B=8", v, round(st.median(rows[("abs_tiered20_w8_b8_s32768", v)]) / f8, 4))
    if ("abs_tiered20_w8_b32_s32768", v) in rows: print("ratio B=32", v, round(st.median(rows[("abs_tiered20_w8_b32_s32768", v)]) / f32, 4))
PY
run() { # NAME ENV...
  local name=$1; shift
  env "$@" timeout 100 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 8 --prompt-len 32768 -n 128 --policy qevict --budget 0.2 > eng_$name.json 2> eng_$name.err
  echo "$name rc $?"
  python3 -c "
import json
for l in open('eng_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine $name TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), 'eager', j['graphs']['eager_steps'], 'first ids', j.get('ids', [[None]])[0][:8] if isinstance(j.get('ids'), list) else '')"
}
run q_spread QE_X=1
run q_nospread QE_CUDA_ATTN_SPREAD=0
timeout 120 test_kv_gpu --small > kv_gpu.log 2>&1; echo "test_kv_gpu --small rc $?: $(tail -1 kv_gpu.log | cut -c1-160), $(grep -c FAIL kv_gpu.log) FAIL"
timeout 100 test_kern_cuda > kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 kern_cuda.log | cut -c1-160)"
tar czf res.tgz --remove-files *.log *.json *.err
