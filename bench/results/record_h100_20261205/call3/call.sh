# call 5 (the lean form of call 4) (2026-12-05, twentieth session): RMSNorm and SwiGLU writing the next matmul's bf16
# input, and the residual add fused with the next RMSNorm (checks; engine A/B against
# QE_CUDA_FUSE_BF16=0 QE_CUDA_FUSE_ADD=0); long_ctx at 32K after its fit fix; generate's
# fullkv_bytes on the GPU; the engine at B=8 with 32K prompts
export PACK=carry/p4; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/p3m
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
timeout 150 test_kern_cuda > $R/kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 $R/kern_cuda.log | cut -c1-150)"
grep -E "then matmul|FAIL" $R/kern_cuda.log | head -16
timeout 150 test_model_graph > $R/tmg.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $R/tmg.log | cut -c1-200)"
eng() { # NAME ENV ARGS...
  local name=$1 e=$2; shift 2
  env $e timeout 100 qevict generate --shape llama3-8b --json --ignore-eos --device 0 "$@" > $R/e_$name.json 2> $R/e_$name.err
  python3 -c "
import json
for l in open('$R/e_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine %-14s TPOT ms %.3f TTFT ms %.1f eager %d' % ('$name', s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3, j['graphs']['eager_steps']), 'ids', j['tokens'][:6])" 2>/dev/null || echo "engine $name failed: $(tail -2 $R/e_$name.err)"
}
B32="--batch 32 --prompt-len 256 -n 1024"
for r in 1; do
  eng full_fuse$r QE_X=1 $B32; eng full_base$r "QE_CUDA_FUSE_BF16=0 QE_CUDA_FUSE_ADD=0" $B32
done
eng q20_fuse QE_X=1 $B32 --policy qevict --budget 0.2; eng q20_base "QE_CUDA_FUSE_BF16=0 QE_CUDA_FUSE_ADD=0" $B32 --policy qevict --budget 0.2
M=$QE_SHARED_MODELS/stories260K.gguf
timeout 60 qevict generate --model $M --prompt "Once upon a time" -n 480 --ignore-eos --json --device 0 --policy qevict --budget 0.3 > $R/fk.json 2> $R/fk.err; echo "generate qevict gpu rc $?"
python3 -c "
import json
j=[json.loads(l) for l in open('$R/fk.json') if l.startswith('{')][0]
f=j['summary']['fullkv_bytes']; b=j['memory']['budget_bytes']; print('stories260K GPU: fullkv_bytes', f, 'budget', b, 'budget / fullkv %.3f' % (b / f))"
timeout 100 qevict bench latency --model $M --input-words 300 -n 64 --rounds 1 --device 0 --policies full,qevict:0.3 2>&1 | tail -4
for pol in full qevict; do
  timeout 100 long_ctx --policy $pol --budget 0.2 --ctx 32768 --new 200 > $R/long_$pol.json 2> $R/long_$pol.err
  echo "long_ctx $pol rc $?: $(tail -1 $R/long_$pol.err)"
done
python3 - $R <<'PY'
import json, sys
d = {}
for p in ("full", "qevict"):
    try: d[p] = json.load(open(f"{sys.argv[1]}/long_{p}.json"))
    except Exception as e: print(p, "unreadable", e); continue
    j = d[p]; print(f"long_ctx {p:7s} {j['sequences']:4d} sequences, step {j['step_ms']:8.3f} ms, {j['tokens_per_s']:8.1f} tokens/s, route {j['route_ms_per_step']:.3f} ms, GPU {j['gpu_used_gb']:.1f} GB")
if len(d) == 2:
    print("qevict / full: %.2fx sequences, %.3fx tokens/s" % (d['qevict']['sequences'] / d['full']['sequences'], d['qevict']['tokens_per_s'] / d['full']['tokens_per_s']))
PY
