source bench/device_unpack.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 200 test_model_graph > $OUT/test_model_graph.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $OUT/test_model_graph.log)"
for dev in cpu gpu; do extra=""; [ $dev = gpu ] && extra="--device 0"
  QEVICT_LOG=debug timeout 60 qevict generate --model carry/models/stories260K.gguf --prompt "Once upon a time" -n 200 --ignore-eos --json $extra > $OUT/stories_$dev.json 2> $OUT/stories_$dev.err; done
python3 - $OUT <<'PY'
import json,sys
def ld(n):
  for l in open(sys.argv[1]+"/"+n):
    if l.startswith("{"): return json.loads(l)
a,b=ld("stories_cpu.json")["tokens"],ld("stories_gpu.json")["tokens"]
n=next((i for i in range(min(len(a),len(b))) if a[i]!=b[i]),None); print("stories gpu vs cpu:", "identical" if n is None and len(a)==len(b) else "diverge at %s"%n, len(a))
PY
grep -c "cuda: gemm" $OUT/stories_gpu.err
for g in heuristic tune; do for pol in full qevict; do extra=""; [ $pol = qevict ] && extra="--policy qevict --budget 0.2"
  QE_CUDA_GEMM=$g QEVICT_LOG=debug timeout 120 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 32 --prompt-len 256 -n 1024 $extra > $OUT/eng_${g}_$pol.json 2> $OUT/eng_${g}_$pol.err
  python3 -c "
import json,sys
for l in open('$OUT/eng_${g}_$pol.json'):
  if l.startswith('{'): s=json.loads(l)['summary']; print('engine $g $pol TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3))"
done; done
grep "cuda: gemm" $OUT/eng_tune_full.err | head -20
QE_BENCH_QUICK=0 timeout 150 attn_decode --bench --shapes lc_q20,abs_tiered20_w8_b8 > $OUT/sweep.log 2>&1; echo "sweep rc $?"
python3 - $OUT/sweep.log <<'PY'
import json,sys
for l in open(sys.argv[1]):
  if l.startswith('{"bench"') and 'chunks_per_seq' in l:
    d=json.loads(l); print("%-28s cw %5d ch %d ms_gpu %.4f chunk-only %.4f"%(d['bench'],d['chunk_win'],d['chunks_per_seq'],d['ms_gpu'],d['ms_chunk_kernel_only']))
PY
cd $OUT && tar czf c1.tgz --remove-files *.json *.err *.log
