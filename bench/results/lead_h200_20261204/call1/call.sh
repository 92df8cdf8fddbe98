source bench/device_unpack.sh
cd $OUT
QE_CUDA_ATTN_LEAD=250 timeout 150 attn_decode > chk250.log 2>&1; echo "check lead 250 rc $?: $(tail -1 chk250.log)"; grep FAIL chk250.log | head -5
QE_CUDA_ATTN_LEAD=250 timeout 90 compute-sanitizer --tool memcheck attn_decode --only "abs gqa4 d128 w8 int2 pairs" > mc.log 2>&1; echo "memcheck rc $?: $(grep -c '^ok' mc.log) ok, $(tail -1 mc.log)"
QE_CUDA_ATTN_LEAD=250 timeout 90 compute-sanitizer --tool racecheck attn_decode --only "abs gqa4 d128 w8 int2 pairs" > rc.log 2>&1; echo "racecheck rc $?: $(grep -c '^ok' rc.log) ok, $(tail -1 rc.log)"
S="full_b8_s32768,abs_tiered20_w8_b8"
for r in 1 2; do for L in 0 30 60 90; do
ATTN_CHUNKS=4 QE_CUDA_ATTN_LEAD=$L timeout 100 attn_decode --bench --shapes "$S" > b_${L}_$r.log 2>&1; echo "lead $L r$r rc $?"
done; done
for L in 0 60; do QE_CUDA_ATTN_LEAD=$L KCA_TRACE_BLOCKS=1 timeout 60 attn_decode_tr --bench --shapes abs_tiered20_w8_b8 > tr_$L.log 2>&1; echo "trace $L rc $?"; grep '"trace"' tr_$L.log | cut -c1-300; done
for f in b_*_[12].log; do python3 -c "
import sys,json
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except: continue
    if 'bench' in d and 'ms_gpu' in d and (d.get('auto') or 'no_masses' in d['bench']): print(sys.argv[1], d['bench'], d.get('chunk_win'), 'gpu', d['ms_gpu'], 'chunk-only', d.get('ms_chunk_kernel_only'))
" $f; done
tar czf res.tgz --remove-files *.log
