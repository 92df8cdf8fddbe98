source bench/device_unpack.sh
export QE_CUDA_GEMM=heuristic
mkdir -p $OUT/p && bash bench/lc_ncu_steps.sh qevict $OUT/p
cat $OUT/p/kernels_qevict.txt | head -40
cd $OUT && tar czf c3.tgz --remove-files p
