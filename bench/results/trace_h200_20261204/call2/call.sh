source bench/device_unpack.sh
S="full_b8,abs_tiered20_w8_b8"
KCA_TRACE_BLOCKS=1 timeout 400 attn_decode --bench --shapes "$S" > $OUT/trace.log 2>&1; echo "rc $?"
grep '"trace"' $OUT/trace.log
