#!/usr/bin/env bash
# gpu_ops: one device call that checks the CUDA backend (issue 5). Builds qevict with CUDA
# (no BLAS, no serving: the GPU machine has neither), runs tests/kernels/test_kern_cuda (every op
# against the CPU backend, whole models teacher-forced, a 1-rank NCCL smoke test), then runs
# `qevict generate` on the GPU and on the CPU with the same prompts and compares the greedy
# tokens: identical, or the first divergence with the logit gap at that position on both
# backends (test_kern_cuda --gap). Batched decode (--batch 4) and two tensor-parallel ranks on
# one GPU (--tp 2, CPU collectives) are compared too. Logs go to $OUT (default bench/out/gpu_ops).
# Usage: bench/gpu_ops.sh [MODEL]   (default carry/models/stories260K.gguf; BUILD=dir to
# build elsewhere than build-gpu)
# Exit status: 0 when the build, test_kern_cuda and every run succeed (token divergences are
# reported, with their gaps, not failed: a near-tie may flip under bf16 weights).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
MODEL=${1:-carry/models/stories260K.gguf}
OUT=${OUT:-bench/out/gpu_ops}
B=${BUILD:-build-gpu}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
FAIL=0
SUMMARY=()

note() { SUMMARY+=("$1"); echo "$1"; }

{ nvidia-smi; nvcc --version; meson --version; } >"$OUT/env.txt" 2>&1
if [ ! -r "$MODEL" ]; then
  echo "gpu_ops: model $MODEL is missing" >&2
  exit 2
fi

# 1. build
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dcuda=enabled -Dserving=disabled -Dblas=disabled >"$OUT/setup.log" 2>&1 ||
    { tail -40 "$OUT/setup.log"; echo "gpu_ops: meson setup failed" >&2; exit 1; }
fi
if ! ninja -C "$B" tests/kernels/test_kern_cuda cli/qevict >"$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"
  echo "gpu_ops: build failed" >&2
  exit 1
fi
note "build: ok ($(grep -c 'Compiling Cuda' "$OUT/build.log") CUDA objects)"

# 2. every op against the CPU backend, models, NCCL
MODEL_DIR=$(cd "$(dirname "$MODEL")" && pwd)
T0=$(date +%s)
QE_SHARED_MODELS=$MODEL_DIR "$B/tests/kernels/test_kern_cuda" >"$OUT/test_kern_cuda.log" 2>&1
RC=$?
if [ $RC -ne 0 ]; then FAIL=1; grep -E "FAIL|error" "$OUT/test_kern_cuda.log" | head -30; fi
note "test_kern_cuda: rc $RC in $(($(date +%s) - T0)) s, $(grep -c '^FAIL' "$OUT/test_kern_cuda.log") failed checks"

# 3. qevict generate, GPU against CPU
Q="$B/cli/qevict"
compare() { # name, extra args...
  local name=$1
  shift
  local cpu="$OUT/gen_${name}_cpu.json" gpu="$OUT/gen_${name}_gpu.json"
  if ! "$Q" generate --model "$MODEL" --json "$@" >"$cpu" 2>"$OUT/gen_${name}_cpu.err"; then
    FAIL=1; note "generate $name: CPU run failed: $(tail -1 "$OUT/gen_${name}_cpu.err")"; return
  fi
  if ! "$Q" generate --model "$MODEL" --json --device 0 "$@" >"$gpu" 2>"$OUT/gen_${name}_gpu.err"; then
    FAIL=1; note "generate $name: GPU run failed: $(tail -1 "$OUT/gen_${name}_gpu.err")"; return
  fi
  local res
  res=$(python3 - "$cpu" "$gpu" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta, tb = a["tokens"], b["tokens"]
sa, sb = a["summary"], b["summary"]
n = min(len(ta), len(tb))
d = next((i for i in range(n) if ta[i] != tb[i]), -1 if len(ta) == len(tb) else n)
rate = lambda s: (s.get("decode_tokens", (s["generated_tokens"] - 1) * s["batch"]) / s["decode_s"]
                  if s["decode_s"] > 0 else 0)  # tokens of the decode-only steps
speed = f"decode {rate(sb):.0f} tok/s on {sb.get('backend')} vs {rate(sa):.0f} on {sa.get('backend')}"
if d < 0:
    print(f"IDENTICAL {len(ta)} tokens; {speed}")
else:
    print(f"DIVERGED at generated token {d} (cpu {ta[d] if d < len(ta) else '-'}, gpu "
          f"{tb[d] if d < len(tb) else '-'}) of {len(ta)}; {speed}")
    print(len(a["prompt_tokens"]), ",".join(map(str, a["prompt_tokens"] + ta)))
PY
)
  note "generate $name: $(echo "$res" | head -1)"
  if [ "$(echo "$res" | wc -l)" -gt 1 ] && [ "$name" != sampled ]; then
    local np ids
    read -r np ids <<<"$(echo "$res" | sed -n 2p)"
    "$B/tests/kernels/test_kern_cuda" --gap "$MODEL" "$np" "$ids" >"$OUT/gap_${name}.txt" 2>&1
    note "  $(grep 'first divergence\|equals' "$OUT/gap_${name}.txt" | head -1)"
  fi
}
compare once --prompt "Once upon a time" -n 300 --ignore-eos
compare dog --prompt "The little dog was sad because" -n 200 --ignore-eos
compare batch4 --prompt "Lily and Ben went to the park" -n 120 --batch 4 --ignore-eos
compare tp2 --prompt "One day, a bird" -n 120 --tp 2 --ignore-eos
compare sampled --prompt "Once upon a time" -n 100 --temp 0.8 --top-k 40 --top-p 0.95 --seed 7

# the tiered cache must refuse the GPU with a clear message, not crash
"$Q" generate --model "$MODEL" --prompt "Hi" -n 4 --device 0 --policy qevict --budget 0.5 \
  >"$OUT/tiered.out" 2>&1
RC=$?
if [ $RC -ne 0 ] && grep -q "CPU backend only" "$OUT/tiered.out"; then
  note "generate --policy qevict --device 0: refused as expected"
else
  FAIL=1; note "generate --policy qevict --device 0: rc $RC, $(tail -1 "$OUT/tiered.out")"
fi

echo
echo "==== gpu_ops summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)) ===="
printf '%s\n' "${SUMMARY[@]}"
echo "-- test_kern_cuda (per-op numbers in test_kern_cuda.log):"
grep -E "^(model|nccl|sample|FAIL)" "$OUT/test_kern_cuda.log" | head -20
tail -1 "$OUT/test_kern_cuda.log"
echo "logs: $OUT"
exit $FAIL
