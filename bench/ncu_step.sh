#!/usr/bin/env bash
# ncu_step.sh: where a decode step's GPU time goes, FullKV against QEvict 20%, in one device
# call with the binaries of carry/pack (bench/device_pack.sh). Runs `qevict generate` on a
# random Llama-3.1-8B shape (B=32, prompt 256, eager steps: --no-graphs) under Nsight Compute
# with only each kernel's duration measured, over SKIP..SKIP+COUNT launches (a few decode steps
# late in the run), and prints per kernel name: launches, total and mean microseconds, per policy,
# and the difference. Usage (repo root, device): bench/ncu_step.sh
# MODE=prefill: where a prefill's GPU time goes instead: one 32K-token prompt and 32 prompts of
# 256 (FullKV, -n 1, every launch of the run, the weight upload's included under its own names),
# per kernel name: launches and total milliseconds, and each shape's sum.
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh || exit 1
OUT=${OUT:-$(pwd)/bench/out/ncu_step}
SKIP=${SKIP:-40000} COUNT=${COUNT:-4000} NEW=${NEW:-64}
mkdir -p "$OUT"
if [[ ${MODE:-} == prefill ]]; then
  for shape in b1_32768 b32_256; do
    IFS=_ read -r b len <<< "$shape"
    timeout 280 ncu --metrics gpu__time_duration.sum --csv qevict generate --json --ignore-eos \
      --shape llama3-8b --device 0 --batch "${b#b}" --prompt-len "$len" -n 1 \
      > "$OUT/ncu_prefill_$shape.csv" 2> "$OUT/ncu_prefill_$shape.err"
    echo "$shape rc $?"
  done
  exec python3 - "$OUT" <<'PY'
import csv, sys, os, collections
for shape in ["b1_32768", "b32_256"]:
    agg = collections.defaultdict(lambda: [0, 0.0])
    try:
        lines = [l for l in open(os.path.join(sys.argv[1], "ncu_prefill_%s.csv" % shape))
                 if l.startswith('"')]
    except OSError:
        continue
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        v = float(r["Metric Value"].replace(",", ""))
        u = r.get("Metric Unit", "ns")
        ms = v / 1e6 if u in ("nsecond", "ns") else v / 1e3 if u in ("usecond", "us") else v
        a = agg[r["Kernel Name"].split("(")[0][:64]]
        a[0] += 1; a[1] += ms
    print("%s: %d launches, %.1f ms of GPU time" % (shape, sum(v[0] for v in agg.values()),
                                                   sum(v[1] for v in agg.values())))
    for n, (k, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:16]:
        print("  %-64s %6d %9.2f ms" % (n, k, ms))
PY
fi
for pol in full q20; do
  P=()
  [[ $pol == q20 ]] && P=(--policy qevict --budget 0.2)
  timeout 280 ncu --metrics gpu__time_duration.sum --csv --launch-skip "$SKIP" \
    --launch-count "$COUNT" qevict generate --json --ignore-eos --shape llama3-8b --device 0 \
    --batch 32 --prompt-len 256 -n "$NEW" --no-graphs "${P[@]}" > "$OUT/ncu_$pol.csv" \
    2> "$OUT/ncu_$pol.err"
  echo "$pol rc $?"
done
python3 - "$OUT" <<'PY'
import csv, sys, os, collections
out = sys.argv[1]
def load(pol):
    agg = collections.defaultdict(lambda: [0, 0.0])
    try:
        lines = [l for l in open(os.path.join(out, "ncu_%s.csv" % pol)) if l.startswith('"')]
    except OSError:
        return agg
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        v = float(r["Metric Value"].replace(",", ""))
        u = r.get("Metric Unit", "ns")
        us = v / 1e3 if u in ("nsecond", "ns") else v if u in ("usecond", "us") else v * 1e3
        name = r["Kernel Name"].split("(")[0][:60]
        agg[name][0] += 1; agg[name][1] += us
    return agg
def steps(agg):  # decode steps covered: one attention launch per layer (32) per step
    n = sum(v[0] for k, v in agg.items() if "kca_chunk_kernel" in k)
    return max(n / 32.0, 1e-9)
a, b = load("full"), load("q20")
sa, sb = steps(a), steps(b)
ta, tb = sum(v[1] for v in a.values()) / sa, sum(v[1] for v in b.values()) / sb
print("steps covered: full %.2f, q20 %.2f; GPU time per step: full %.0f us, q20 %.0f us" %
      (sa, sb, ta, tb))
names = sorted(set(a) | set(b), key=lambda n: -max(a[n][1] / sa, b[n][1] / sb))
print("per decode step:")
print("%-60s %7s %9s %7s %9s %9s" % ("kernel", "n full", "us full", "n q20", "us q20", "q20-full"))
for n in names[:30]:
    print("%-60s %7.1f %9.1f %7.1f %9.1f %9.1f" % (n, a[n][0] / sa, a[n][1] / sa, b[n][0] / sb,
          b[n][1] / sb, b[n][1] / sb - a[n][1] / sa))
PY
