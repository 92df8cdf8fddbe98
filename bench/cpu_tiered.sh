#!/usr/bin/env bash
# cpu_tiered: the quick start's long-context job on the CPU (SmolLM2-135M-Instruct, packed
# weights, the 2,776-token report of tests/data/towns_2k.txt, greedy, N new tokens), decoded
# with FullKV and QEvict 20%, each with the CPU pool's threads spinning before they sleep (the
# default) and never spinning (QE_CPU_SPIN_US=0, as before 2026-12-05); QEvict reading its
# windows in place (the default) and gathering every accessible token first
# (QE_TIERED_GATHER=1, the path before 2026-12-05). Rounds alternate the configurations
# (ROUNDS, default 3); the table shows each one's median decode and prefill figures, the
# ratios to FullKV, and whether every QEvict run gave the same tokens.
# Usage: bench/cpu_tiered.sh [N_NEW_TOKENS] (default 200); BATCH=8 decodes 8 copies at once.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-1}
THREADS=${THREADS:-$(nproc)}
MODEL=$(deploy/fetch-model.sh)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() { # name, env, policy options
  local name=$1 env=$2
  shift 2
  env $env build/cli/qevict generate --model "$MODEL" --prompt-file tests/data/towns_2k.txt \
    --chat -n "$N" --ignore-eos --batch "$BATCH" --threads "$THREADS" --cpu-weights packed \
    "$@" --json >"$OUT/${name}_$r.json"
}
Q="--policy qevict --budget 0.2"
for r in $(seq "$ROUNDS"); do
  run full QE_TIERED_GATHER=0 --policy full
  run inplace QE_TIERED_GATHER=0 $Q
  run gather QE_TIERED_GATHER=1 $Q
  run fullnospin QE_CPU_SPIN_US=0 --policy full
  run inplacenospin QE_CPU_SPIN_US=0 $Q
  run gathernospin "QE_CPU_SPIN_US=0 QE_TIERED_GATHER=1" $Q
done
python3 - "$OUT" "$THREADS" "$BATCH" <<'PY'
import glob, json, os, statistics, sys
out, threads, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = {}
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(p).rsplit("_", 1)[0]
    d = json.load(open(p))
    s = d["summary"]
    dtok = s.get("decode_tokens", s["steps"] * batch)  # tokens of the decode-only steps
    rows.setdefault(name, []).append((dtok / s["decode_s"], s["prefill_s"],
                                      d["tokens"]))
med = {k: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs))
       for k, vs in rows.items()}
label = {"full": "FullKV", "inplace": "QEvict 20%, windows read in place",
         "gather": "QEvict 20%, gathered (QE_TIERED_GATHER=1)",
         "fullnospin": "FullKV, threads never spin (QE_CPU_SPIN_US=0)",
         "inplacenospin": "QEvict 20% in place, threads never spin",
         "gathernospin": "QEvict 20% gathered, threads never spin"}
print("threads %s, batch %d; median of %d rounds" % (threads, batch, len(rows["full"])))
print("| cache | decode tok/s | vs FullKV | vs FullKV, no spin | prefill s |")
print("| --- | --- | --- | --- | --- |")
for k in ("full", "inplace", "gather", "fullnospin", "inplacenospin", "gathernospin"):
    print("| %s | %.1f | %.2f | %.2f | %.2f |" % (label[k], med[k][0], med[k][0] / med["full"][0],
                                                   med[k][0] / med["fullnospin"][0], med[k][1]))
qe = [k for k in rows if k.startswith(("inplace", "gather"))]
same = all(v[2] == rows["inplace"][0][2] for k in qe for v in rows[k])
print("every QEvict run gave the same tokens: %s" % same)
PY
