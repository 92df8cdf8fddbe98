source bench/device_unpack.sh
X=$(command -v attn_decode) OUT=$OUT/attn SHAPES="full_b32_s1280,full_b8_s32768,tiered20_w8,abs_tiered20_b8,full_b32_s32768" sh bench/gpu_attn.sh 2>&1 | tail -40
cd $OUT && tar czf attn.tgz --remove-files attn
