source bench/device_unpack.sh
cd $OUT
export QE_TEST_MODEL_DIR=$PWD/carry/models 2>/dev/null
QE_CUDA_ATTN_LEAD=250 timeout 150 attn_decode > chk250.log 2>&1; echo "check lead 250 (forced) rc $?: $(tail -1 chk250.log)"; grep FAIL chk250.log | head -5
for t in test_kv_gpu test_model_graph; do QE_CUDA_ATTN_LEAD=250 timeout 200 $t > ${t}_250.log 2>&1; echo "$t lead 250 rc $?: $(tail -1 ${t}_250.log | cut -c1-200)"; done
echo "test_kv_gpu: $(grep -c ' 0 mismatches' test_kv_gpu_250.log) cases with 0 mismatches, $(grep -c FAIL test_kv_gpu_250.log) FAIL"
timeout 120 test_model_graph > tmg.log 2>&1; echo "test_model_graph default rc $?: $(tail -1 tmg.log | cut -c1-200)"
S="full_b8_s32768,abs_tiered20_w8_b8,abs_tiered20_w8_b32_s32768"
for r in 1 2; do for b in attn_decode attn_decode_lpf; do
ATTN_CHUNKS=4 QE_CUDA_ATTN_LEAD=0 timeout 100 $b --bench --shapes "$S" > b_${b}_0_$r.log 2>&1; echo "$b lead 0 r$r rc $?"
ATTN_CHUNKS=4 timeout 100 $b --bench --shapes "$S" > b_${b}_d_$r.log 2>&1; echo "$b lead default r$r rc $?"
done; for L in 45 75; do ATTN_CHUNKS=4 QE_CUDA_ATTN_LEAD=$L timeout 100 attn_decode --bench --shapes abs_tiered20_w8_b8 > b_attn_decode_${L}_$r.log 2>&1; done; done
for f in b_*_[12].log; do python3 -c "
import sys,json
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except: continue
    if 'bench' in d and 'ms_gpu' in d and (d.get('auto') or 'no_masses' in d['bench']): print(sys.argv[1], d['bench'], d.get('chunk_win'), 'gpu', d['ms_gpu'], 'chunk-only', d.get('ms_chunk_kernel_only'))
" $f; done | sort -k2,2 -k1,1
tar czf res.tgz --remove-files *.log
