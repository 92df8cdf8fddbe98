source bench/device_unpack.sh
X=$(command -v attn_decode) OUT=$OUT/attn SHAPES="full_b32_s1280,full_b8_s32768,tiered20_w8,abs_tiered20_b8,full_b32_s32768" sh bench/gpu_attn.sh 2>&1 | tail -40
cd $OUT
for r in 1 2; do for L in 0 d; do
if [ $L = d ]; then unset QE_CUDA_ATTN_LEAD; else export QE_CUDA_ATTN_LEAD=0; fi
ATTN_CHUNKS=4 timeout 100 attn_decode --bench --shapes "full_b8_s32768,abs_tiered20_w8_b8" > ab_${L}_$r.log 2>&1; echo "lead $L r$r rc $?"
done; done; unset QE_CUDA_ATTN_LEAD
for f in ab_*_[12].log; do python3 -c "
import sys,json
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except: continue
    if 'bench' in d and 'ms_gpu' in d and (d.get('auto') or 'no_masses' in d['bench']): print(sys.argv[1], d['bench'], d.get('chunk_win'), 'gpu', d['ms_gpu'], 'chunk-only', d.get('ms_chunk_kernel_only'))
" $f; done | sort -k2,2 -k1,1 | uniq
tar czf attn.tgz --remove-files attn ab_*.log
