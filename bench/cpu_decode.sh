#!/usr/bin/env bash
# cpu_decode: CPU decode throughput of qevict on SmolLM2-135M-Instruct (Q4_1 GGUF) at batch 1
# and 8, with the weights dequantized to fp32 (--cpu-weights f32, the default) and kept packed
# (--cpu-weights packed), and llama.cpp on the same file in the same run (batch 1, through the
# llama-cpp-python package) when PEER_PY names a python that can import llama_cpp:
#   python3 -m venv /tmp/lcp && /tmp/lcp/bin/pip install llama-cpp-python numpy
#   PEER_PY=/tmp/lcp/bin/python bench/cpu_decode.sh 64
# Rounds alternate the engines (ROUNDS, default 3); the table shows each one's median and the
# ratios to qevict f32 and to llama.cpp. Usage: bench/cpu_decode.sh [N_NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-128}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
MODEL=$(deploy/fetch-model.sh)
PROMPT="The history of the lighthouse begins with the"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  for W in f32 packed; do
    for B in 1 8; do
      build/cli/qevict generate --model "$MODEL" --prompt "$PROMPT" -n "$N" --ignore-eos \
        --batch "$B" --threads "$THREADS" --cpu-weights "$W" --json >"$OUT/qevict_${W}_b${B}_$r.json"
    done
  done
  if [[ -n "${PEER_PY:-}" ]]; then
    "$PEER_PY" bench/cpu_peer_llama.py "$MODEL" "$PROMPT" "$((N - 1))" "$THREADS" \
      >"$OUT/llama_b1_$r.json"
  fi
done
python3 - "$OUT" "$THREADS" <<'PY'
import glob, json, os, statistics, sys
out, threads = sys.argv[1], sys.argv[2]
rows = {}
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(p).rsplit("_", 1)[0]
    d = json.load(open(p))
    if name.startswith("llama"):
        rows.setdefault(name, []).append((d["decode_tokens"] / d["decode_s"], d["tokens"], None))
    else:
        s, b = d["summary"], int(name.rsplit("_b", 1)[1])
        w = d["ranks"][0]["weight_bytes"]
        dtok = s.get("decode_tokens", (s["generated_tokens"] - 1) * b)  # decode-only steps'
        rows.setdefault(name, []).append((dtok / s["decode_s"],
                                          d["tokens"], w))
med = {k: statistics.median(v[0] for v in vs) for k, vs in rows.items()}
label = {"qevict_f32_b1": "qevict f32, batch 1", "qevict_packed_b1": "qevict packed, batch 1",
         "qevict_f32_b8": "qevict f32, batch 8", "qevict_packed_b8": "qevict packed, batch 8",
         "llama_b1": "llama.cpp, batch 1"}
print("threads %s; median of %d rounds" % (threads, len(rows["qevict_f32_b1"])))
print("| engine | weight MB | decode tok/s | vs qevict f32 | vs llama.cpp |")
print("| --- | --- | --- | --- | --- |")
for k in ("qevict_f32_b1", "qevict_packed_b1", "llama_b1", "qevict_f32_b8", "qevict_packed_b8"):
    if k not in med:
        continue
    b = k.rsplit("_b", 1)[1]
    f32 = med.get("qevict_f32_b" + b)
    peer = med.get("llama_b1") if b == "1" else None
    w = rows[k][0][2]
    print("| %s | %s | %.1f | %s | %s |" % (label[k], "%.0f" % (w / 1e6) if w else "-", med[k],
          "%.2f" % (med[k] / f32) if f32 else "-", "%.2f" % (med[k] / peer) if peer else "-"))
f32t, pkt = rows["qevict_f32_b1"][0][1], rows["qevict_packed_b1"][0][1]
print("packed tokens == f32 tokens: %s" % (f32t == pkt))
if "llama_b1" in rows:
    lt = rows["llama_b1"][0][1]
    same = next((i for i, (a, b) in enumerate(zip(f32t, lt)) if a != b), None)
    print("llama.cpp tokens == qevict's: %s" % ("all %d" % len(lt) if same is None else
                                              "first difference at %d" % same))
PY
