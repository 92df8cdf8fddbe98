source bench/device_unpack.sh
for v in "qevict tune" "qevict heuristic" "full tune" "full heuristic"; do set -- $v
  QE_CUDA_GEMM=$2 QEVICT_LOG=debug timeout 130 long_ctx --policy $1 --budget 0.2 --ctx 32768 --new 200 > $OUT/lc_$1_$2.json 2> $OUT/lc_$1_$2.err; echo "lc $1 gemm $2 rc $?: $(cut -c1-400 $OUT/lc_$1_$2.json | grep -o '"sequences[^,]*,\|"step_ms[^,]*,\|"tokens_per_s[^,]*,\|"route_ms_per_step[^,]*,' | tr -d '\n')"
done
grep "cuda: gemm" $OUT/lc_qevict_tune.err | head -12; grep "cuda: gemm" $OUT/lc_full_tune.err | head -12
cd $OUT && tar czf c2.tgz --remove-files *.json *.err
