source bench/device_unpack.sh
cd $OUT
timeout 150 attn_decode > chk.log 2>&1; echo "check default rc $?: $(tail -1 chk.log)"; grep FAIL chk.log | head -5
for L in d 250; do
if [ $L = d ]; then unset QE_CUDA_ATTN_LEAD; else export QE_CUDA_ATTN_LEAD=$L; fi
for t in test_kv_gpu test_model_graph; do timeout 200 $t > ${t}_$L.log 2>&1; echo "$t lead $L rc $?: $(tail -1 ${t}_$L.log | cut -c1-200)"; done
echo "test_kv_gpu lead $L: $(grep -c ' 0 mismatches' test_kv_gpu_$L.log) cases with 0 mismatches, $(grep -c FAIL test_kv_gpu_$L.log) FAIL"
done; unset QE_CUDA_ATTN_LEAD
ATTN_CHUNKS=4 timeout 100 attn_decode --bench --shapes "abs_tiered20_w8_b8" > b.log 2>&1; grep '"auto": true' b.log | cut -c1-120; grep -o '"ms_gpu": [0-9.]*' b.log | head -3
tar czf res.tgz --remove-files *.log
