#!/usr/bin/env bash
# gpu_graphs.sh: in one device call, with the binaries of carry/pack (bench/device_pack.sh): the
# GPU checks (test_model_graph: CUDA-graph decode against the eager path; test_kv_gpu: the GPU
# cache, its observers against the CPU's; test_kern_cuda; attn_decode against the fp64
# reference), then the engine on a random Llama-3.1-8B shape (B=32 x prompt 256 x 256 new, and
# B=1 x prompt 64 x 256 new), FullKV and QEvict 20%, decode steps as CUDA graphs against
# --no-graphs in the same call; prints a table (TTFT, TPOT, tokens/s, graphs/eager, same
# tokens). CHECKS=0 leaves the checks out; LONG=1 adds long_ctx at 32K (FullKV and QEvict 20%:
# how many 32K-token sequences fit on the GPU and their decode tokens/s). Logs and JSON under
# $OUT. NEW=N: new tokens of the B=32 runs (default 256); EAGER=0: graphs only; B1=0: no B=1 runs.
# RUNS: the B=32 caches (default "full q20"; q20abs / q20pos: QEvict 20% with post-RoPE (the
# default) / pre-RoPE INT2 keys, --key-frame); LONG_RUNS: long_ctx's (default "full qevict";
# qevict_abs / qevict_pos likewise).
# Usage (repo root, device): bench/gpu_graphs.sh
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh || exit 1
OUT=${OUT:-$(pwd)/bench/out/gpu_graphs}
mkdir -p "$OUT"
export QE_SHARED_MODELS=$(pwd)/carry/models
echo "== checks"
[[ ${CHECKS:-1} == 0 ]] || for t in test_model_graph test_kv_gpu test_kern_cuda attn_decode; do
  timeout 240 "$t" > "$OUT/$t.log" 2>&1
  echo "$t rc $?"
  grep -E "^FAIL|fail|graph" "$OUT/$t.log" | grep -v " 0 fail" | head -6
done
gen() { # NAME args...
  local name=$1
  shift
  timeout 200 qevict generate --json --ignore-eos --shape llama3-8b --device 0 "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc $?"
  grep -v '^$' "$OUT/$name.err" | tail -1
}
echo "== engine"
MODES="graphs eager"
[[ ${EAGER:-1} == 0 ]] && MODES=graphs
pol_args() { # RUN: the generate options of a B=32 cache name
  case $1 in
    q20) echo --policy qevict --budget 0.2 ;;
    q20abs) echo --policy qevict --budget 0.2 --key-frame abs ;;
    q20pos) echo --policy qevict --budget 0.2 --key-frame pos ;;
  esac
}
for pol in ${RUNS:-full q20}; do
  read -r -a P <<< "$(pol_args "$pol")"
  for g in $MODES; do
    G=()
    [[ $g == eager ]] && G=(--no-graphs)
    gen "b32_${pol}_$g" --batch 32 --prompt-len 256 -n "${NEW:-256}" "${P[@]}" "${G[@]}"
  done
done
[[ ${B1:-1} == 0 ]] || for g in $MODES; do
  G=()
  [[ $g == eager ]] && G=(--no-graphs)
  gen "b1_full_$g" --prompt-len 64 -n 256 "${G[@]}"
done
if [[ ${LONG:-0} == 1 ]]; then
  echo "== 32K: long_ctx, FullKV vs QEvict 20%"
  for pol in ${LONG_RUNS:-full qevict}; do
    KF=()
    [[ $pol == *_abs || $pol == *_pos ]] && KF=(--key-frame "${pol##*_}")
    timeout 200 long_ctx --policy "${pol%_*}" --budget 0.2 --ctx 32768 --new 16 "${KF[@]}" \
      > "$OUT/long_$pol.json" 2> "$OUT/long_$pol.err"
    echo "long_ctx $pol rc $?: $(tail -1 "$OUT/long_$pol.err")"
  done
fi
python3 - "$OUT" "${RUNS:-full q20}" "${LONG_RUNS:-full qevict}" <<'PY'
import json, sys, os
out, runs, long_runs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def load(n):
    try: return json.load(open(os.path.join(out, n + ".json")))
    except Exception: return None
print("%-16s %9s %9s %9s %10s %s" % ("run", "TTFT ms", "TPOT ms", "tok/s", "graphs", "tokens = eager"))
for base in ["b32_" + r for r in runs] + ["b1_full"]:
    e = load(base + "_eager")
    for g in ["graphs", "eager"]:
        j = load(base + "_" + g)
        if not j: print("%-16s missing" % (base + "_" + g)); continue
        s = j["summary"]; st = s.get("decode_steps", s["generated_tokens"] - 1)  # decode-only
        tpot = s["decode_s"] / st * 1e3 if st > 0 else float("nan")
        gr = j.get("graphs", {})
        same = "" if g == "eager" or not e else str(j.get("tokens") == e.get("tokens"))
        print("%-16s %9.1f %9.3f %9.0f %10s %s" % (base + "_" + g, s["prefill_s"] * 1e3, tpot,
              s.get("decode_tokens", s["batch"] * st) / s["decode_s"] if s["decode_s"] > 0 else 0,
              "%s/%s" % (gr.get("replays", "-"), gr.get("eager_steps", "-")), same))
lc = {}
for pol in long_runs:
    try: lc[pol] = json.loads(open(os.path.join(out, "long_%s.json" % pol)).read().strip().splitlines()[-1])
    except Exception: pass
for pol, j in lc.items():
    print("long_ctx 32K %-7s %4d sequences, step %8.1f ms, %7.0f tokens/s" % (pol, j["sequences"],
          j["step_ms"], j["tokens_per_s"]))
for pol in [p for p in lc if p != "full" and "full" in lc]:
    print("%s / FullKV: %.2fx sequences, %.2fx tokens/s" % (pol, lc[pol]["sequences"] /
          lc["full"]["sequences"], lc[pol]["tokens_per_s"] / lc["full"]["tokens_per_s"]))
full = load("b32_full_graphs")
for r in [r for r in runs if r != "full"]:
    j = load("b32_%s_graphs" % r)
    if full and j:
        t = lambda x: x["summary"]["decode_s"] / x["summary"].get(
            "decode_steps", x["summary"]["generated_tokens"] - 1)  # per decode-only step
        print("TPOT %s / FullKV (graphs): %.3f" % (r, t(j) / t(full)))
PY
