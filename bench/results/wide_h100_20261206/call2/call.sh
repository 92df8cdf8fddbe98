export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r2; mkdir -p $R
for t in memcheck racecheck; do
  for x in "test_kc_quant" "test_kv_gpu --small" "attn_decode --small"; do
    n="$R/san_${t}_$(printf %s "$x" | tr -c 'A-Za-z0-9_' _).log"
    timeout 200 compute-sanitizer --tool $t $x > "$n" 2>&1
    echo "$t $x rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$n" | tail -1) at $SECONDS s"
  done
done
for sp in 2 3 4 6; do for lead in none 150 300; do
  [ $SECONDS -gt 540 ] && break
  if [ $lead = none ]; then E=""; else E="QE_CUDA_ATTN_LEAD=$lead"; fi
  env $E QE_CUDA_ATTN_SPLIT=$sp ATTN_CHUNKS=$sp timeout 60 attn_decode --bench --shapes lc_q20_w8_b121 > $R/r2_${sp}_$lead.log 2>&1
  echo "split $sp lead $lead: $(grep -o '"bench": "lc_q20[^}]*"auto": true[^}]*' $R/r2_${sp}_$lead.log | grep -o '"ms_gpu": [0-9.]*' | head -1)"
done; done
(cd $OUT && tar czf r2.tgz --remove-files r2)
