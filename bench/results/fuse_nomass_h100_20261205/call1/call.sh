# call 1 (2026-12-05, twenty-second session): the tree's GPU checks (the twenty-first session's
# last stacking changes had not run on a GPU), FullKV B=8 32K against cuDNN at 3, 4 and 8 chunks
# (no masses, chunk kernel alone), cuDNN's kernel at that shape (ncu), the pipeline stand-in's
# ring depths (ATTN_CPV=1), one engine run
export PACK=carry/pack; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
timeout 120 attn_decode > $R/check.log 2>&1; echo "attn_decode checks rc $?: $(grep -c '^FAIL' $R/check.log) FAIL; $(tail -1 $R/check.log | cut -c1-120)"
for r in 1 2; do
  python3 bench/sdpa_queued.py --shapes 8x32768 > $R/peer_$r.log 2>&1
  ATTN_CHUNKS=3,4,8 timeout 120 attn_decode --bench --shapes full_b8_s32768 > $R/ch_fuse_$r.log 2>&1
  QE_CUDA_ATTN_FUSE=0 ATTN_CHUNKS=3,4,8 timeout 120 attn_decode --bench --shapes full_b8_s32768 > $R/ch_comb_$r.log 2>&1
done
grep -h '"torch-sdpa-cudnn"' $R/peer_*.log | python3 -c "import json,sys; print('cudnn ms_gpu', [round(json.loads(l)['ms_gpu'],4) for l in sys.stdin])"
for f in $R/ch_*.log; do echo "$(basename $f): $(grep -h 'no_masses"' $f | sed 's/.*chunk_win": \([0-9]*\), "ms_gpu": \([0-9.]*\), "ms_gpu_chunk_kernel_only": \([0-9.]*\).*/cw \1 \2 (chunk only \3)/' | tr '\n' ' ')"; done
grep -h '"full_b8_s32768_engine\|full_b8_s32768", "batch"' $R/ch_fuse_1.log | cut -c1-200 | head -3
timeout 150 test_kern_cuda > $R/kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 $R/kern_cuda.log | cut -c1-150)"
grep -iE "FAIL|mismatch" $R/kern_cuda.log | head -5
timeout 150 test_model_graph > $R/tmg.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $R/tmg.log | cut -c1-200)"
timeout 150 test_kv_gpu --small > $R/kv_gpu.log 2>&1; echo "test_kv_gpu --small rc $?: $(tail -1 $R/kv_gpu.log | cut -c1-160), $(grep -c FAIL $R/kv_gpu.log) FAIL"
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
  env $e timeout 120 qevict generate --shape llama3-8b --json --ignore-eos --device 0 "$@" > $R/e_$name.json 2> $R/e_$name.err
  python3 -c "
import json
for l in open('$R/e_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine %-12s TPOT ms %.3f TTFT ms %.1f eager %d' % ('$name', s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3, j['graphs']['eager_steps']), 'ids', j['tokens'][:6])" 2>/dev/null || echo "engine $name failed: $(tail -2 $R/e_$name.err)"
}
eng full_b32 QE_X=1 --batch 32 --prompt-len 256 -n 1024
eng full_b8_32k QE_X=1 --batch 8 --prompt-len 32768 -n 128
eng full_b8_32k_comb QE_CUDA_ATTN_FUSE=0 --batch 8 --prompt-len 32768 -n 128
ATTN_CPV=1 timeout 200 attn_decode --bench --pipes --shapes full_b8_s32768 > $R/cpv.log 2>&1
grep -h '_cpv"' $R/cpv.log | python3 -c "
import json,sys
for l in sys.stdin:
  j=json.loads(l); print('%-14s spin %4d  %.4f ms  %.3f of copy  %s' % (j['cfg'], j['spin'], j['ms_gpu'], j['frac_copy_bw_gpu'], j['reads_match_cp']))"
grep -h 'cp_pipeline' $R/cpv.log | cut -c1-140
timeout 120 ncu --section LaunchStats --section Occupancy --section SpeedOfLight -k regex:cudnn --launch-count 3 python3 bench/sdpa_queued.py --shapes 8x32768 --rep 2 > $R/ncu_cudnn_b8.txt 2>&1
grep -E "cudnn_generated|Grid Size|Block Size|Registers Per|Dynamic Shared|Static Shared|Duration|DRAM Throughput|Waves Per SM|Achieved Occupancy" $R/ncu_cudnn_b8.txt | head -24
(cd $OUT && tar czf r.tgz --remove-files r)
