source bench/device_unpack.sh
timeout 240 test_kv_gpu > $OUT/test_kv_gpu.log 2>&1; echo "test_kv_gpu rc $?: $(tail -2 $OUT/test_kv_gpu.log | tr '\n' ' ')"
for v in "qevict long_ctx" "qevict long_ctx_old" "full long_ctx" "qevict long_ctx" "full long_ctx"; do set -- $v
  timeout 150 $2 --policy $1 --budget 0.2 --ctx 32768 --new 200 > $OUT/lc.json 2> $OUT/lc.err; echo "$2 $1 rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"promotions[^,]*,\|"demotions[^,]*,' $OUT/lc.json | tr -d '\n')"; cat $OUT/lc.json >> $OUT/lc_all.json; done
rm -f $OUT/lc.json $OUT/lc.err
