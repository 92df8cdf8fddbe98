source bench/device_unpack.sh
timeout 200 attn_decode > $OUT/check.log 2>&1; echo "check rc $?: $(tail -1 $OUT/check.log)"; grep FAIL $OUT/check.log | head -3
for t in memcheck racecheck; do timeout 200 compute-sanitizer --tool $t attn_decode --small > $OUT/$t.log 2>&1; echo "$t rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$t.log | tail -1)"; done
S="full_b8,abs_tiered20_w8_b8,lc_q20_w8_b121,full_b32_s1280"
for r in 1 2; do for c in 0 1; do
QE_CUDA_ATTN_CLUSTER=$c ATTN_CHUNKS=4 timeout 300 attn_decode --bench --shapes "$S" > $OUT/ab_c${c}_$r.log 2>&1; echo "cluster=$c round $r rc $?"
done; done
timeout 200 attn_decode_tr --bench --shapes "full_b8,abs_tiered20_w8_b8" 2>&1 | grep '"trace"' > $OUT/trace.log
cut -c1-330 $OUT/trace.log
python3 bench/sdpa_queued.py > $OUT/peer_queued.log 2>&1; echo "sdpa rc $?"; tail -5 $OUT/peer_queued.log
for c in 0 1; do echo "== cluster=$c"; cat $OUT/ab_c${c}_[12].log | python3 -c "
import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d and d['auto']: print(d['bench'],d['chunks_per_seq'],'gpu',d.get('ms_gpu'),'idle',d['ms'])
    elif 'ms_gpu_chunk_kernel_only' in d: print('   nomass cw',d['chunk_win'],d['ms_gpu'],d['ms_gpu_chunk_kernel_only'])
    elif d.get('bench','').endswith('no_masses') and 'over_with_masses' in d: print('  ',d['bench'],'gpu',d['ms_gpu'])
" | sort; done
