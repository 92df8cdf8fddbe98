#!/usr/bin/env bash
# gpu_record.sh: one device call that records a tree's end-to-end figures for issue 5 with the
# binaries of carry/pack (qevict, long_ctx, test_model_graph; bench/device_pack.sh's pack_bin):
#   - test_model_graph (CUDA-graph decode against the eager path, FullKV and tiered rows);
#   - the engine, Llama-3.1-8B shape, B=32, prompt 256, 1,024 new, CUDA graphs, FullKV and
#     QEvict 20%, and long_ctx at 32K, FullKV and QEvict 20% (bench/gpu_graphs.sh, LONG=1);
#   - the TTFT of one 32K-token prompt, FullKV and QEvict 20% (qevict generate -n 1);
#   - Hugging Face transformers eager on the same engine shape (carry/peers/peers.py hf-e2e);
#   - PROFILE=1: QEvict's long_ctx decode steps 6-8 by kernel (bench/lc_ncu_steps.sh).
# Tars its logs to $OUT/record.tgz and prints one table last.
# Usage (repo root, on the device): bash bench/gpu_record.sh   (carry: carry/pack carry/peers)
cd "$(dirname "$0")/.." || exit 2
source bench/device_unpack.sh || exit 1
R=$OUT/record
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader \
  | tee "$R/gpu.txt"
timeout 200 test_model_graph > "$R/tmg.log" 2>&1
echo "test_model_graph rc $?: $(tail -n 1 "$R/tmg.log")"
OUT=$R/graphs CHECKS=0 NEW=1024 EAGER=0 B1=0 LONG=1 bash bench/gpu_graphs.sh > "$R/graphs.log" 2>&1
echo "gpu_graphs rc $?"
for pol in full q20; do
  P=()
  [[ $pol == q20 ]] && P=(--policy qevict --budget 0.2)
  timeout 200 qevict generate --json --ignore-eos --shape llama3-8b --device 0 --prompt-len 32768 \
    -n 1 "${P[@]}" > "$R/ttft32k_$pol.json" 2> "$R/ttft32k_$pol.err"
  echo "ttft 32K $pol rc $?"
done
if [[ -f carry/peers/peers.py ]]; then
  timeout 300 python3 carry/peers/peers.py hf-e2e --batch 32 --prompt 256 --new 1024 \
    > "$R/hf_e2e.json" 2> "$R/hf_e2e.err"
  echo "transformers eager rc $?"
fi
[[ ${PROFILE:-0} == 1 ]] && bash bench/lc_ncu_steps.sh qevict "$R"
tail -n 12 "$R/graphs.log"
python3 - "$R" <<'PY'
import json, sys, os
d = sys.argv[1]
for pol in ["full", "q20"]:
    try:
        s = json.load(open(os.path.join(d, "ttft32k_%s.json" % pol)))["summary"]
        print("TTFT one 32K-token prompt %-4s %9.1f ms" % (pol, s["prefill_s"] * 1e3))
    except Exception as e: print("TTFT 32K %s: unreadable (%s)" % (pol, e))
try:
    h = json.loads(open(os.path.join(d, "hf_e2e.json")).read().strip().splitlines()[-1])
    print("transformers eager B=32: TTFT %.1f ms, TPOT %.2f ms, %.0f tokens/s" % (h["ttft_ms"],
          h["tpot_ms"], h["tokens_per_s"]))
except Exception as e: print("transformers: unreadable (%s)" % e)
PY
tar -C "$OUT" -czf "$OUT/record.tgz" record && rm -rf "$R"
