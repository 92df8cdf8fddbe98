source bench/device_unpack.sh
timeout 200 attn_decode_nw12 > $OUT/check_nw12.log 2>&1; echo "nw12 check rc $?: $(tail -1 $OUT/check_nw12.log)"; grep FAIL $OUT/check_nw12.log | head -3
S="full_b8,abs_tiered20_w8_b8,full_b32_s1280,lc_q20_w8_b121"
for r in 1 2; do for b in attn_decode attn_decode_nw12; do
ATTN_CHUNKS="1,2,3,4" timeout 300 $b --bench --shapes "$S" > $OUT/${b}_$r.log 2>&1; echo "$b rc $?"
done; done
for b in attn_decode attn_decode_nw12; do echo "== $b"; cat $OUT/${b}_[12].log | grep -v '^tr ' | python3 -c "
import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d: print(d['bench'],d['chunks_per_seq'],d['auto'],'gpu',d.get('ms_gpu'),'chunk-only idle',d['ms_chunk_kernel_only'])
    elif 'ms_gpu_chunk_kernel_only' in d: print('   nomass cw',d['chunk_win'],d['ms_gpu'],d['ms_gpu_chunk_kernel_only'])
    elif 'trace' in d: print(l.strip()[:330])
" | sort | uniq; done
