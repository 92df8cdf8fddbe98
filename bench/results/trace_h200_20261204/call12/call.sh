source bench/device_unpack.sh
timeout 120 test_kv_gpu > $OUT/test_kv_gpu.log 2>&1; echo "test_kv_gpu rc $?: $(tail -1 $OUT/test_kv_gpu.log | cut -c1-200) / $(grep -c 'FAIL' $OUT/test_kv_gpu.log) FAIL lines"
timeout 140 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 200 > $OUT/lc_qevict.json 2> $OUT/lc_qevict.err; echo "lc qevict rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"promotions[^,]*,\|"demotions[^,]*,\|"quantizations[^,]*,\|"evictions[^,]*' $OUT/lc_qevict.json | tr -d '\n')"
cd $OUT && tar czf c12.tgz --remove-files *.json *.err *.log
