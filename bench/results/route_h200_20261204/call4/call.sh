source bench/device_unpack.sh
for pol in qevict full; do timeout 150 long_ctx --policy $pol --budget 0.2 --ctx 32768 --new 200 > $OUT/lc200_$pol.json 2> $OUT/lc200_$pol.err; echo "lc $pol rc $?: $(grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,\|"gpu_used_gb[^,]*,' $OUT/lc200_$pol.json | tr -d '\n')"; done
QE_LC_PROFILE=150:152 timeout 300 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 160 > $OUT/ncu_late.csv 2> $OUT/ncu_late.err; echo "ncu rc $?"
python3 tools/ncu_kernel_times.py $OUT/ncu_late.csv 3 > $OUT/kernels_late.txt; head -30 $OUT/kernels_late.txt
cd $OUT && tar czf c4.tgz --remove-files *.json *.err *.csv *.txt
