#!/usr/bin/env bash
# diag_table: the mechanism diagnostics of every policy at equal persistent bytes on
# SmolLM2-135M-Instruct with a ~2.8K-token document and a question (tests/data/towns_2k.txt):
# for each budget, a FullKV shadow generates N tokens and each policy is teacher-forced on
# them. Prints a markdown table (and keeps the JSON lines in bench/out/).
# Usage: bench/diag_table.sh [N_NEW_TOKENS] [BUDGETS...]   (defaults: 48, 0.1 0.2)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-48}; shift || true
BUDGETS=("${@:-0.1 0.2}")
[[ $# -gt 0 ]] || BUDGETS=(0.1 0.2)
MODEL=$(deploy/fetch-model.sh)
mkdir -p bench/out
OUT=bench/out/diag_$(date +%Y%m%d_%H%M%S).jsonl
POLICIES=(streaming snapkv pyramidkv knorm h2o h2o+graphkv kivi qevict qevict+graphkv)
for B in "${BUDGETS[@]}"; do
  for P in "${POLICIES[@]}"; do
    if line=$(build/cli/qevict generate --model "$MODEL" --prompt-file tests/data/towns_2k.txt \
              --chat -n "$N" --ignore-eos --policy "$P" --budget "$B" --diagnostics --json 2>/dev/null); then
      echo "{\"budget\":$B,\"result\":$line}" >>"$OUT"
    else
      echo "{\"budget\":$B,\"result\":{\"policy\":\"$P\",\"error\":true}}" >>"$OUT"
    fi
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| budget | policy | bytes / budget | Full / INT2 / Evicted windows | FMM | churn | Global LIR | TTR | QSA | INT2 mass ratio | agreement |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
f = lambda x: "n/a" if x is None or x != x else f"{x:.4f}"
for r in rows:
    res = r["result"]
    if res.get("error"):
        print(f"| {r['budget']:.0%} | {res['policy']} | error (budget below the protected regions?) |||||||||"); continue
    d, m = res["diagnostics"], res["memory"]
    print(f"| {r['budget']:.0%} | {res['policy']} | {m['bytes']} / {m['budget_bytes']} | "
          f"{m['windows_full']} / {m['windows_int2']} / {m['windows_evicted']} | {f(d['fmm'])} | {f(d['churn'])} | "
          f"{f(d['global_lir'])} | {f(d['ttr_median'])} | {f(d['qsa'])} | {f(d['int2_mass_ratio'])} | {f(d['agreement'])} |")
PY
