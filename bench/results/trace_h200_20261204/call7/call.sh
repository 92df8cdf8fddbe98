source bench/device_unpack.sh
timeout 500 attn_decode --bench --shapes "full_b8,abs_tiered20_w8_b8,full_b32_s32768,abs_tiered20_w8_b32_s32768" > $OUT/bench.log 2>&1; echo "rc $?"
tail -12 $OUT/bench.log
