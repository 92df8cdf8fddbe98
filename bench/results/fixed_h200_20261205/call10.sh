source bench/device_unpack.sh
cd $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
S="full_b8_s32768,abs_tiered20_w8_b8"
for L in def 0 1; do
  if [ $L = def ]; then E="QE_X=0"; else E="QE_CUDA_ATTN_LEAD=$L"; fi
  env $E ATTN_CHUNKS=4 ATTN_FIXED=6 timeout 110 attn_decode --bench --shapes "$S" > fx_$L.log 2>&1
  echo "fixed lead $L rc $?"
  grep '_fixed' fx_$L.log | cut -c1-400
done
timeout 150 attn_decode > chk.log 2>&1; echo "attn_decode check rc $?: $(tail -1 chk.log)"; grep FAIL chk.log | head -5
timeout 90 test_kern_cuda > kern_cuda.log 2>&1; echo "test_kern_cuda rc $?: $(tail -1 kern_cuda.log | cut -c1-200)"
timeout 120 test_kv_gpu --small > kv_gpu.log 2>&1; echo "test_kv_gpu --small rc $?: $(tail -1 kv_gpu.log | cut -c1-200), $(grep -c FAIL kv_gpu.log) FAIL"
tar czf res.tgz --remove-files *.log
