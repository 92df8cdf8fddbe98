source bench/device_unpack.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for t in test_kv_gpu test_model_graph; do timeout 240 $t > $OUT/$t.log 2>&1; echo "$t rc $?: $(tail -1 $OUT/$t.log | cut -c1-300)"; done
grep -c "0 mismatches" $OUT/test_kv_gpu.log
for v in qevict full qevict full; do
  timeout 150 long_ctx --policy $v --budget 0.2 --ctx 32768 --new 200 > $OUT/lc.json 2> $OUT/lc.err; echo "lc $v rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"promotions[^,]*,' $OUT/lc.json | tr -d '\n')"; cat $OUT/lc.json >> $OUT/lc_all.json; done
for pol in full qevict; do extra=""; [ $pol = qevict ] && extra="--policy qevict --budget 0.2"
  timeout 120 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 32 --prompt-len 256 -n 1024 $extra > $OUT/eng_$pol.json 2> $OUT/eng_$pol.err
  python3 -c "
import json
for l in open('$OUT/eng_$pol.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine $pol TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), {k:v for k,v in s.items() if 'rout' in k})"
done
rm -f $OUT/lc.json $OUT/lc.err
QE_LC_PROFILE=150:152 timeout 200 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 160 > $OUT/ncu_late.csv 2> $OUT/ncu_late.err; echo "ncu rc $?"
python3 tools/ncu_kernel_times.py $OUT/ncu_late.csv 3 > $OUT/kernels_late.txt; head -12 $OUT/kernels_late.txt; tail -1 $OUT/kernels_late.txt
cd $OUT && tar czf c6.tgz --remove-files *.json *.err *.csv *.txt *.log
