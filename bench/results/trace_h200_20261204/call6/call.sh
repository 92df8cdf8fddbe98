source bench/device_unpack.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 attn_decode > $OUT/check.log 2>&1; echo "check rc $?: $(tail -1 $OUT/check.log)"; grep FAIL $OUT/check.log | head -3
for t in memcheck racecheck; do timeout 200 compute-sanitizer --tool $t attn_decode --small > $OUT/$t.log 2>&1; echo "$t rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$t.log | tail -1)"; done
timeout 240 test_model_graph > $OUT/test_model_graph.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $OUT/test_model_graph.log | cut -c1-200)"
S="full_b8,abs_tiered20_w8_b8,full_b32_s1280"
for r in 1 2; do for b in attn_decode attn_decode_cout4; do
timeout 300 $b --bench --shapes "$S" > $OUT/ab_${b}_$r.log 2>&1; echo "$b round $r rc $?"
done; done
for b in attn_decode attn_decode_cout4; do echo "== $b"; cat $OUT/ab_${b}_[12].log | python3 -c "
import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except: continue
    if 'chunks_per_seq' in d and d['auto']: print(d['bench'],d['chunks_per_seq'],'gpu',d.get('ms_gpu'),'idle',d['ms'], 'of copy gpu', d.get('frac_copy_bw_gpu'))
    elif d.get('bench','').endswith('no_masses') and 'over_with_masses' in d: print('  ',d['bench'],'gpu',d['ms_gpu'],'idle',d['ms'],'of copy gpu',d['frac_copy_bw_gpu'])
" | sort; done
python3 bench/sdpa_queued.py > $OUT/peer_queued.log 2>&1; echo "sdpa rc $?"; grep -o '"peer": "[a-z-]*", "batch": [0-9]*, "seq": [0-9]*\|"ms_gpu": [0-9.]*' $OUT/peer_queued.log | paste - -
for v in qevict full; do
  timeout 150 long_ctx --policy $v --budget 0.2 --ctx 32768 --new 200 > $OUT/lc_$v.json 2> $OUT/lc_$v.err; echo "lc $v rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"promotions[^,]*,' $OUT/lc_$v.json | tr -d '\n')"; done
cd $OUT && tar czf c6.tgz --remove-files *.json *.err *.log
