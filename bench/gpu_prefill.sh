#!/usr/bin/env bash
# gpu_prefill.sh: prefill attention on the GPU machine, in one device call (issue 5). With the
# binaries of carry/pack (bench/device_pack.sh; unpacked by bench/device_unpack.sh):
#   checks   test_kern_cuda --attention (attention against the CPU backend: the fused prefill
#            kernel, the GEMM path and the reference kernel on fresh random data), and the same
#            under compute-sanitizer memcheck and racecheck (test_kern_cuda --fused: the fused
#            kernel's cases; $SAN_S seconds each, default 150)
#   ttft     the Llama-3.1-8B shape (random bf16 weights built from the shape), time to first
#            token for one 32K-token prompt and for 32 prompts of 256, FullKV and QEvict 20% (its
#            key masses: the last queries through the reference kernel), with the fused kernel
#            (default) and with QE_CUDA_PREFILL=gemm, in this call
#   peer     Hugging Face transformers (SDPA attention) on the same two shapes (carry/peers)
# then one table: TTFT, fused / GEMM, fused / transformers. Usage (repo root, on the device):
#   OUT=DIR bench/gpu_prefill.sh        (SKIP_PEER=1 leaves transformers out)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-bench/out/gpu_prefill}
mkdir -p "$OUT"
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh > /dev/null || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.log"

timeout 300 test_kern_cuda --attention > "$OUT/test_kern_cuda.log" 2>&1
echo "test_kern_cuda --attention rc $?"
grep -E "^FAIL|fused|gemm path" "$OUT/test_kern_cuda.log" | head -24
for tool in memcheck racecheck; do # (the fused kernel's cases: their CPU references are the long part)
  timeout "${SAN_S:-150}" compute-sanitizer --tool $tool test_kern_cuda --fused \
    > "$OUT/$tool.log" 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
done

gen() { # NAME PREFILL_MODE args...
  local name=$1 mode=$2
  shift 2
  QE_CUDA_PREFILL=$mode timeout 200 qevict generate --shape llama3-8b --device 0 --json \
    --ignore-eos -n 2 "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc $?"
}
for mode in flash gemm; do
  m=$mode
  [[ $mode == flash ]] && m=""
  gen "b1_32k_full_$mode" "$m" --batch 1 --prompt-len 32768
  gen "b1_32k_q20_$mode" "$m" --batch 1 --prompt-len 32768 --policy qevict --budget 0.2
  gen "b32_256_full_$mode" "$m" --batch 32 --prompt-len 256
  gen "b32_256_q20_$mode" "$m" --batch 32 --prompt-len 256 --policy qevict --budget 0.2
done
if [[ -z ${SKIP_PEER:-} ]]; then
  timeout 240 python3 carry/peers/peers.py hf-e2e --impl sdpa --batch 1 --prompt 32768 --new 2 \
    > "$OUT/peer_b1_32k.log" 2>&1
  echo "peer b1_32k rc $?"
  timeout 200 python3 carry/peers/peers.py hf-e2e --impl sdpa --batch 32 --prompt 256 --new 2 \
    > "$OUT/peer_b32_256.log" 2>&1
  echo "peer b32_256 rc $?"
fi

python3 - "$OUT" << 'EOF'
import json, sys
out = sys.argv[1]
def ttft(name):
    try: return json.load(open(f"{out}/{name}.json"))["summary"]["prefill_s"] * 1e3
    except Exception: return None
def peer(name):
    try:
        for l in open(f"{out}/peer_{name}.log"):
            if l.startswith("{"): return json.loads(l).get("ttft_ms")
    except OSError: return None
f = lambda x: f"{x:10.1f}" if x else f"{'-':>10}"
r = lambda a, b: f"{a / b:9.3f}" if a and b else f"{'-':>9}"
print(f"{'shape':<10} {'policy':<7} {'fused ms':>10} {'gemm ms':>10} {'HF sdpa':>10} {'f/gemm':>9} {'f/HF':>9}")
for shape in ["b1_32k", "b32_256"]:
    p = peer(shape)
    for pol in ["full", "q20"]:
        a, b = ttft(f"{shape}_{pol}_flash"), ttft(f"{shape}_{pol}_gemm")
        print(f"{shape:<10} {pol:<7} {f(a)} {f(b)} {f(p)} {r(a, b)} {r(a, p)}")
EOF
tar -C "$OUT" -czf "$OUT/../prefill_logs.tgz" . 2> /dev/null
