source bench/device_unpack.sh
timeout 200 attn_decode > $OUT/check.log 2>&1; echo "check rc $?: $(tail -1 $OUT/check.log)"; grep -E 'FAIL|max chunks|chunking past' $OUT/check.log | head -5
for t in test_kv_gpu test_model_graph; do timeout 240 $t > $OUT/$t.log 2>&1; echo "$t rc $?: $(tail -1 $OUT/$t.log | cut -c1-200)"; done
echo "test_kv_gpu: $(grep -c ' 0 mismatches' $OUT/test_kv_gpu.log) cases with 0 mismatches, $(grep -c FAIL $OUT/test_kv_gpu.log) FAIL"
ATTN_CHUNKS="1,2,3" timeout 500 attn_decode --bench --shapes "full_b32_s32768,abs_tiered20_w8_b32_s32768,lc_fkv_b29,full_b8,abs_tiered20_w8_b8" > $OUT/bench.log 2>&1; echo "bench rc $?"
python3 -c "
import json
for l in open('$OUT/bench.log'):
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d: print(d['bench'],d['chunks_per_seq'],d['auto'],'gpu',d.get('ms_gpu'),'ratio',d.get('ratio_to_full_gpu'))
    elif 'ms_gpu_chunk_kernel_only' in d: print('   nomass cw',d['chunk_win'],d['ms_gpu'],d['ms_gpu_chunk_kernel_only'])
    elif 'over_with_masses' in d: print('  ',d['bench'],'cw',d['chunk_win'],'gpu',d['ms_gpu'])
"
tail -9 $OUT/bench.log
