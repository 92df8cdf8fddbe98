source bench/device_unpack.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
S="full_b8,abs_tiered20_w8_b8,lc_q20_w8_b121"
timeout 400 attn_decode --bench --shapes "$S" > $OUT/trace.log 2>&1; echo "rc $?"
grep '"trace"' $OUT/trace.log
grep -o '"bench": "[a-z0-9_]*", "batch[^}]*"auto": true[^}]*' $OUT/trace.log | grep -o '"bench": "[a-z0-9_]*"\|"ms_gpu": [0-9.]*\|"ratio_to_full_gpu": [0-9.]*' | paste - - - | head
tail -12 $OUT/trace.log
