source bench/device_unpack.sh
for v in full qevict; do
  timeout 150 long_ctx --policy $v --budget 0.2 --ctx 32768 --new 200 > $OUT/lc_$v.json 2> $OUT/lc_$v.err; echo "lc $v rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"promotions[^,]*,' $OUT/lc_$v.json | tr -d '\n')"; done
cd $OUT && tar czf c13.tgz --remove-files *.json *.err
