#!/usr/bin/env bash
# gpu_engine.sh: the whole engine on the GPU machine, in one device call (issue 5 (b), issue 6).
# Uses prebuilt binaries from $BIN (default carry/bin: qevict, test_kv_gpu, test_kern_cuda built
# here with -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false, see bench/README.md)
# or builds them into build-gpu-engine when $BIN has none (also test_kc_quant and long_ctx). Logs under $OUT, then one table:
#   checks     test_kv_gpu (paged cache + kernels vs CPU references), test_kern_cuda (every op,
#              argmax, weight upload, models), compute-sanitizer memcheck + racecheck of
#              test_kv_gpu
#   gpu/cpu    greedy tokens of stories260K (carry/models) on GPU and CPU
#   engine     Llama-3.1-8B shape, random bf16 weights built from the shape (no download),
#              B=32, prompt 256, 1024 new tokens, FullKV: TTFT, TPOT, tokens/s; the same on
#              Hugging Face transformers (eager) through ../shared/peers/peers.py (carry/peers)
#   long       TTFT of one 32K-token prompt
#   tp         with 2+ GPUs: TP=2 over NCCL against TP=1, greedy ids for 256 steps (B=1), and
#              TP=2 TPOT at B=32
# Usage (repo root): bench/gpu_engine.sh      (SKIP_PEER=1 skips the transformers run)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-bench/out/gpu_engine}
BIN=${BIN:-carry/bin}
PEERS=${PEERS:-carry/peers/peers.py}
MODELS=${MODELS:-carry/models}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.log" 2>&1
cat "$OUT/gpu.log"

if [ ! -x "$BIN/qevict" ]; then
  BIN=build-gpu-engine
  [ -f "$BIN/build.ninja" ] || meson setup "$BIN" -Dcuda=enabled -Dserving=disabled \
    -Dblas=disabled -Dnative=false > "$OUT/build.log" 2>&1
  ninja -C "$BIN" cli/qevict tests/kernels/test_kv_gpu tests/kernels/test_kern_cuda \
    tests/kernels/test_kc_quant bench/long_ctx >> "$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
  ln -sf tests/kernels/test_kc_quant "$BIN/test_kc_quant"
  ln -sf bench/long_ctx "$BIN/long_ctx"
  ln -sf cli/qevict "$BIN/qevict"
  ln -sf tests/kernels/test_kv_gpu "$BIN/test_kv_gpu"
  ln -sf tests/kernels/test_kern_cuda "$BIN/test_kern_cuda"
fi
Q="$BIN/qevict"

echo "== checks"
"$BIN/test_kv_gpu" > "$OUT/test_kv_gpu.log" 2>&1
echo "test_kv_gpu rc $?" | tee "$OUT/rc_kv_gpu"
grep -E "^FAIL|error|exact|normalized|pool" "$OUT/test_kv_gpu.log" | head -20
"$BIN/test_kc_quant" > "$OUT/test_kc_quant.log" 2>&1
echo "test_kc_quant rc $?" | tee "$OUT/rc_kc_quant"
grep -E "^FAIL" "$OUT/test_kc_quant.log" | head -20
QE_SHARED_MODELS=$(pwd)/$MODELS "$BIN/test_kern_cuda" > "$OUT/test_kern_cuda.log" 2>&1
echo "test_kern_cuda rc $?" | tee "$OUT/rc_kern_cuda"
grep -E "^FAIL" "$OUT/test_kern_cuda.log" | head -20
compute-sanitizer --tool memcheck --leak-check full "$BIN/test_kv_gpu" --small \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?" | tee "$OUT/rc_memcheck"
compute-sanitizer --tool racecheck "$BIN/test_kv_gpu" --small > "$OUT/racecheck.log" 2>&1
echo "racecheck rc $?" | tee "$OUT/rc_racecheck"
tail -1 "$OUT/memcheck.log"; tail -1 "$OUT/racecheck.log"

echo "== gpu vs cpu (stories260K)"
if [ -r "$MODELS/stories260K.gguf" ]; then
  for dev in cpu gpu; do
    extra=""; [ $dev = gpu ] && extra="--device 0"
    $Q generate --model "$MODELS/stories260K.gguf" --prompt "Once upon a time" -n 200 \
      --ignore-eos --json $extra > "$OUT/stories_$dev.json" 2> "$OUT/stories_$dev.err"
  done
fi

run_shape() { # name, args... (TMO: time limit in seconds)
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout "${TMO:-600}" $Q generate --shape llama3-8b --json --ignore-eos "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  local rc=$?
  echo "$name rc $rc in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
  tail -2 "$OUT/$name.err"
}

echo "== engine: llama3-8b shape, B=32, prompt 256, 1024 new (FullKV)"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 -i 0 > "$OUT/mem_e1.log" &
SMI=$!
run_shape e1_full_b32 --device 0 --batch 32 --prompt-len 256 -n 1024
kill $SMI 2> /dev/null
echo "== engine: the same at QEvict 20%"
run_shape e2_qevict20_b32 --device 0 --batch 32 --prompt-len 256 -n 1024 --policy qevict \
  --budget 0.2
echo "== long context: concurrent 32K-token sequences, FullKV vs QEvict 20%"
for pol in full qevict; do
  timeout 240 "$BIN/long_ctx" --policy $pol --budget 0.2 --ctx 32768 --new 16 \
    > "$OUT/long_$pol.json" 2> "$OUT/long_$pol.err"
  echo "long_ctx $pol rc $?"; cat "$OUT/long_$pol.json"; tail -2 "$OUT/long_$pol.err"
done
echo "== long: one 32K-token prompt (LONG=1)"
[ -n "${LONG:-}" ] && TMO=240 run_shape long_32k --device 0 --batch 1 --prompt-len 32768 -n 4
if [ "$NGPU" -ge 2 ]; then
  echo "== tp: TP=2 over NCCL vs TP=1"
  run_shape tp1_b1 --device 0 --batch 1 --prompt-len 64 -n 256
  run_shape tp2_b1 --device 0 --tp 2 --batch 1 --prompt-len 64 -n 256
  run_shape tp2_b32 --device 0 --tp 2 --batch 32 --prompt-len 256 -n 256
  run_shape tp2_qevict20_b32 --device 0 --tp 2 --batch 32 --prompt-len 256 -n 256 \
    --policy qevict --budget 0.2
  run_shape tp1_b32_256 --device 0 --batch 32 --prompt-len 256 -n 256
fi
if [ -z "${SKIP_PEER:-}" ] && [ -f "$PEERS" ]; then
  echo "== peer: transformers eager"
  timeout 400 python3 "$PEERS" hf-e2e --batch 32 --prompt 256 --new 1024 --impl eager \
    > "$OUT/peer_hf.log" 2>&1
  grep '"peer"' "$OUT/peer_hf.log"
fi

echo "== summary"
python3 - "$OUT" << 'EOF'
import json, sys, os
out = sys.argv[1]
def load(name):
    try:
        for l in open(f"{out}/{name}"):
            if l.startswith("{"): return json.loads(l)
    except (OSError, ValueError): return None
def rc(name):
    try: return open(f"{out}/rc_{name}").read().split()[-1]
    except OSError: return "n/a"
print("checks: test_kv_gpu rc", rc("kv_gpu"), "| test_kc_quant rc", rc("kc_quant"),
      "| test_kern_cuda rc", rc("kern_cuda"),
      "| memcheck rc", rc("memcheck"), "| racecheck rc", rc("racecheck"))
c, g = load("stories_cpu.json"), load("stories_gpu.json")
if c and g:
    a, b = c["tokens"], g["tokens"]
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    print(f"stories260K greedy GPU vs CPU: {'identical' if n is None and len(a) == len(b) else f'first divergence at token {n}'} ({len(a)} tokens)")
def engine(name):
    j = load(f"{name}.json")
    if not j: return None
    s = j["summary"]; steps = s.get("decode_steps", s["generated_tokens"] - 1)  # decode-only steps
    tpot = s["decode_s"] / steps * 1e3 if steps > 0 else float("nan")
    dtok = s.get("decode_tokens", s["batch"] * steps)
    return {"ttft_ms": s["prefill_s"] * 1e3, "tpot_ms": tpot, "batch": s["batch"],
            "tok_s": dtok / s["decode_s"] if s["decode_s"] > 0 else 0, "ids": j["tokens"]}
peer = None
try:
    for l in open(f"{out}/peer_hf.log"):
        if l.startswith("{"): peer = json.loads(l)
except OSError: pass
try: mem = max(int(x) for x in open(f"{out}/mem_e1.log") if x.strip().isdigit())
except (OSError, ValueError): mem = None
print(f"{'run':<26} {'TTFT ms':>10} {'TPOT ms':>9} {'tok/s':>9} {'vs HF TPOT':>11}")
for name in ["e1_full_b32", "e2_qevict20_b32", "long_32k", "tp1_b1", "tp2_b1", "tp1_b32_256",
             "tp2_b32", "tp2_qevict20_b32"]:
    e = engine(name)
    if not e: continue
    ratio = f"{e['tpot_ms'] / peer['tpot_ms']:11.3f}" if peer and "tpot_ms" in peer and name.startswith("e") else f"{'':>11}"
    print(f"{name:<26} {e['ttft_ms']:10.1f} {e['tpot_ms']:9.3f} {e['tok_s']:9.1f} {ratio}")
if peer: print("transformers eager:", {k: peer[k] for k in peer if k != "peer"})
if mem: print(f"e1 peak GPU memory (nvidia-smi): {mem} MiB")
e1, e2 = engine("e1_full_b32"), engine("e2_qevict20_b32")
j2 = load("e2_qevict20_b32.json")
if j2 and "routing_gpu_ms_decode" in j2.get("memory", {}):
    m, s2 = j2["memory"], j2["summary"]
    print(f"QEvict 20% routing: {m['routing_passes_decode']} decode passes, "
          f"{m['routing_gpu_ms_decode']:.1f} GPU ms = "
          f"{m['routing_gpu_ms_decode'] / (s2['decode_s'] * 1e3):.3%} of decode time; "
          f"{m['routing_passes_prefill']} prefill passes, {m['routing_gpu_ms_prefill']:.1f} ms")
if e1 and e2: print(f"QEvict 20% / FullKV TPOT at B=32: {e2['tpot_ms'] / e1['tpot_ms']:.3f} (target <= 1)")
lf, lq = load("long_full.json"), load("long_qevict.json")
if lf and lq:
    print(f"32K context: FullKV {lf['sequences']} sequences, {lf['tokens_per_s']:.0f} tok/s; "
          f"QEvict 20% {lq['sequences']} sequences, {lq['tokens_per_s']:.0f} tok/s: "
          f"{lq['sequences'] / lf['sequences']:.2f}x sequences, "
          f"{lq['tokens_per_s'] / lf['tokens_per_s']:.2f}x tokens/s (targets 4x, 3x)")
t1, t2 = engine("tp1_b1"), engine("tp2_b1")
if t1 and t2:
    a, b = t1["ids"], t2["ids"]
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    print(f"TP=2 vs TP=1 greedy (llama3-8b shape): {'identical' if n is None else f'first divergence at {n}'} over {len(a)} tokens")
EOF
