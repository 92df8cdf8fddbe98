source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
ROOT=$(pwd)
cd $OUT
QE_CUDA_ATTN_SPREAD=1 timeout 100 attn_decode > chk_s1.log 2>&1
echo "check spread 1 rc $?: $(tail -1 chk_s1.log)"; grep FAIL chk_s1.log | head -3
for T in memcheck racecheck; do
  QE_CUDA_ATTN_SPREAD=1 timeout 80 compute-sanitizer --tool $T attn_decode --only "abs gqa4 d128 w8 int2 pairs" > $T.log 2>&1; echo "$T spread1 rc $?: $(grep -c '^ok' $T.log) ok, $(tail -1 $T.log)"
done
S="full_b8_s32768,abs_tiered20_w8_b8,full_b32_s32768,abs_tiered20_w8_b32_s32768,lc_q20_w8_b121"
for r in 1 2 3; do for M in 0 1; do
  QE_CUDA_ATTN_SPREAD=$M timeout 120 attn_decode --bench --shapes "$S" > b_${M}_$r.log 2>&1
  echo "bench spread $M r$r rc $?"
done; done
python3 - <<'PY'
import json, glob, statistics as st
rows = {}
for f in sorted(glob.glob("b_*_*.log")):
    m = f.split("_")[1]
    for l in open(f):
        try: d = json.loads(l)
        except Exception: continue
        b = d.get("bench", "")
        if d.get("auto") and "ms_gpu" in d: rows.setdefault((b, m), []).append(d["ms_gpu"])
for (b, m), v in sorted(rows.items()):
    print(f"{b:32s} spread {m}: gpu ms {' '.join('%.4f' % x for x in v)}  median {st.median(v):.4f}")
full = {m: st.median(v) for (b, m), v in rows.items() if b == "full_b8_s32768"}
full32 = {m: st.median(v) for (b, m), v in rows.items() if b == "full_b32_s32768"}
for (b, m), v in sorted(rows.items()):
    if b == "abs_tiered20_w8_b8_s32768": print("ratio B=8", m, round(st.median(v) / full["0"], 4))
    if b == "abs_tiered20_w8_b32_s32768": print("ratio B=32", m, round(st.median(v) / full32["0"], 4))
PY
tar czf res.tgz --remove-files *.log
