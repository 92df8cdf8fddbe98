# call 1 (2026-12-05, twenty-first session): q, k, v and gate, up as one matmul each
# (QE_CUDA_FUSE_PROJ): test_kern_cuda (the three new ops against the CPU and the unfused ops),
# test_model_graph, stories260K GPU == CPU, the engine A/B (same binary) at B=32
export PACK=carry/pack; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
timeout 150 test_kern_cuda > $R/kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 $R/kern_cuda.log | cut -c1-150)"
grep -E "qkv_rope|swiglu_cat|weight_concat|FAIL|model" $R/kern_cuda.log | head -24
timeout 150 test_model_graph > $R/tmg.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $R/tmg.log | cut -c1-200)"
M=$QE_SHARED_MODELS/stories260K.gguf
for dev in cpu gpu; do
  extra=""; [ $dev = gpu ] && extra="--device 0"
  timeout 60 qevict generate --model $M --prompt "Once upon a time" -n 200 --ignore-eos --json $extra > $R/st_$dev.json 2> $R/st_$dev.err
done
python3 - $R <<'PY'
import json, sys
def ids(f):
    for l in open(f):
        if l.startswith('{'): return json.loads(l)['tokens']
a, b = ids(sys.argv[1] + '/st_cpu.json'), ids(sys.argv[1] + '/st_gpu.json')
print('stories260K 200 greedy tokens, GPU == CPU:', a == b, 'first diff', next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None))
PY
eng() { # NAME ENV ARGS...
  local name=$1 e=$2; shift 2
  env $e timeout 90 qevict generate --shape llama3-8b --json --ignore-eos --device 0 "$@" > $R/e_$name.json 2> $R/e_$name.err
  python3 -c "
import json
for l in open('$R/e_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine %-12s TPOT ms %.3f TTFT ms %.1f eager %d' % ('$name', s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3, j['graphs']['eager_steps']), 'ids', j['tokens'][:6])" 2>/dev/null || echo "engine $name failed: $(tail -2 $R/e_$name.err)"
}
B32="--batch 32 --prompt-len 256 -n 1024"
eng full_fused QE_X=1 $B32; eng full_base QE_CUDA_FUSE_PROJ=0 $B32
eng q20_fused QE_X=1 $B32 --policy qevict --budget 0.2; eng q20_base QE_CUDA_FUSE_PROJ=0 $B32 --policy qevict --budget 0.2
eng full_fused2 QE_X=1 $B32; eng full_base2 QE_CUDA_FUSE_PROJ=0 $B32
(cd $OUT && tar czf r.tgz --remove-files r)
