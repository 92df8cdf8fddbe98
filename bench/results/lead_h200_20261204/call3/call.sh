source bench/device_unpack.sh
cd $OUT
for L in 0 75; do QE_CUDA_ATTN_LEAD=$L KCA_TRACE_BLOCKS=1 timeout 60 attn_decode_tr --bench --shapes abs_tiered20_w8_b8,full_b8_s32768 > tr_$L.log 2>&1; echo "trace $L rc $?"; grep '"trace"' tr_$L.log | cut -c1-300; done
tar czf res.tgz --remove-files *.log
