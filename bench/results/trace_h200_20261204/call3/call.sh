source bench/device_unpack.sh
ATTN_CHUNKS="4,5,8,12,16,24,32" timeout 400 attn_decode --bench --shapes "full_b8,abs_tiered20_w8_b8" > $OUT/sweep.log 2>&1; echo "rc $?"
grep -v '^tr ' $OUT/sweep.log | python3 -c "
import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d: print(d['bench'],d['chunks_per_seq'],d['auto'],'idle',d['ms'],'chunk-only idle',d['ms_chunk_kernel_only'],'gpu',d.get('ms_gpu'))
    elif 'ms_gpu_chunk_kernel_only' in d: print('   nomass cw',d['chunk_win'],d['ms_gpu'],d['ms_gpu_chunk_kernel_only'])
    elif 'trace' in d: print(l.strip())
"
