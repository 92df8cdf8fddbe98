source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
ROOT=$(pwd)
cd $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
for M in 1 2; do
  QE_CUDA_ATTN_PDL=$M timeout 100 attn_decode > chk_$M.log 2>&1
  echo "check pdl $M rc $?: $(tail -1 chk_$M.log)"; grep FAIL chk_$M.log | head -3
done
QE_CUDA_ATTN_PDL=1 timeout 60 compute-sanitizer --tool memcheck attn_decode --only "abs gqa4 d128 w8 int2 pairs" > mc.log 2>&1; echo "memcheck pdl1 rc $?: $(grep -c '^ok' mc.log) ok, $(tail -1 mc.log)"
S="full_b8_s32768,abs_tiered20_w8_b8,full_b32_s32768,abs_tiered20_w8_b32_s32768"
for r in 1 2; do for M in 0 1 2; do
  QE_CUDA_ATTN_PDL=$M timeout 120 attn_decode --bench --shapes "$S" > b_${M}_$r.log 2>&1
  echo "bench pdl $M r$r rc $?"
done; done
timeout 120 python3 $ROOT/bench/sdpa_queued.py --shapes 8x32768,32x32768 > peer.log 2>&1; echo "peer rc $?"
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
        elif b.endswith("_no_masses") and "ms_gpu" in d and "over_with_masses" in d:
            rows.setdefault((b, m), []).append(d["ms_gpu"])
peer = {}
for l in open("peer.log"):
    try: d = json.loads(l)
    except Exception: continue
    if "ms_gpu" in d: peer[(d.get("peer"), d.get("batch"), d.get("seq"))] = d["ms_gpu"]
print("peer", peer)
for (b, m), v in sorted(rows.items()):
    print(f"{b:40s} pdl {m}: gpu ms {' '.join('%.4f' % x for x in v)}  median {st.median(v):.4f}")
PY
tar czf res.tgz --remove-files *.log
