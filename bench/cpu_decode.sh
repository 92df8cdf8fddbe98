#!/usr/bin/env bash
# cpu_decode: CPU decode throughput of qevict on SmolLM2-135M-Instruct (Q4_1 GGUF, weights
# dequantized to fp32 at load) at batch 1 and 8. Prints one line per configuration.
# Usage: bench/cpu_decode.sh [N_NEW_TOKENS]   (build first: deploy/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-128}
MODEL=$(deploy/fetch-model.sh)
PROMPT=$(python3 -c "print('The history of the lighthouse begins with ' * 16)")
printf '%-8s %-12s %-14s %-14s\n' batch threads "prefill tok/s" "decode tok/s"
for B in 1 8; do
  OUT=$(build/cli/qevict generate --model "$MODEL" --prompt "$PROMPT" -n "$N" --ignore-eos \
        --batch "$B" --json)
  python3 - "$B" "$(nproc)" <<PY
import json, sys
s = json.loads('''$OUT''')["summary"]
b = int(sys.argv[1])
pf = s["prompt_tokens"] * b / s["prefill_s"]
dc = (s["generated_tokens"] - 1) * b / s["decode_s"]
print(f"{b:<8} {sys.argv[2]:<12} {pf:<14.1f} {dc:<14.1f}")
PY
done
