source bench/device_unpack.sh
timeout 200 attn_decode > $OUT/check.log 2>&1; echo "check rc $?: $(tail -1 $OUT/check.log)"; grep -E 'FAIL' $OUT/check.log | head -5
QE_CUDA_ATTN_COOP=0 timeout 200 attn_decode > $OUT/check_nocoop.log 2>&1; echo "check (no coop) rc $?: $(tail -1 $OUT/check_nocoop.log)"
for t in memcheck racecheck; do timeout 240 compute-sanitizer --tool $t attn_decode --small > $OUT/$t.log 2>&1; echo "$t rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$t.log | tail -1)"; done
for t in test_kv_gpu test_model_graph; do timeout 240 $t > $OUT/$t.log 2>&1; echo "$t rc $?: $(tail -1 $OUT/$t.log | cut -c1-200)"; done
S="full_b8,abs_tiered20_w8_b8,full_b32_s1280"
for r in 1 2; do for c in 0 1; do
QE_CUDA_ATTN_COOP=$c timeout 300 attn_decode --bench --shapes "$S" > $OUT/ab_c${c}_$r.log 2>&1; echo "coop=$c round $r rc $?"
done; done
for c in 0 1; do echo "== coop=$c"; cat $OUT/ab_c${c}_[12].log | python3 -c "
import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d and d['auto']: print(d['bench'],d['chunks_per_seq'],'gpu',d.get('ms_gpu'),'idle',d['ms'],'ratio',d.get('ratio_to_full_gpu'))
    elif d.get('bench','').endswith('no_masses') and 'over_with_masses' in d: print('  ',d['bench'],'gpu',d['ms_gpu'],'idle',d['ms'],'of copy',d['frac_copy_bw_gpu'])
" | sort; done
python3 bench/sdpa_queued.py > $OUT/peer_queued.log 2>&1; echo "sdpa rc $?"; grep -o '"peer": "[a-z-]*", "batch": [0-9]*, "seq": [0-9]*\|"ms_gpu": [0-9.]*' $OUT/peer_queued.log | paste - -
cd $OUT && tar czf c10.tgz --remove-files *.log
