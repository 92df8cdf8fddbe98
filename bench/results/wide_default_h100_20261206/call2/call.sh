# The wide rule as the default on an H200 (2026-12-06, twenty-seventh session): the checks ran on
# an H100 the same day with the same pack (bench/results/wide_default_h100_20261206); this call
# times long_ctx QEvict 20% (the default) and FullKV, then, with time left, QEvict under the old
# rule and the kernel at 121 x 32K new / old. Carry carry/pack (bench/device_pack.sh).
export PACK=carry/pack
CHECKS=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=new bash bench/gpu_longctx_ab.sh
[[ $SECONDS -lt 110 ]] && QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 CHECKS=0 ROUNDS=1 NEW=200 \
  BINS=long_ctx POLS=qevict TAG=old bash bench/gpu_longctx_ab.sh
source bench/device_unpack.sh
if [[ $SECONDS -lt 150 ]]; then
  ATTN_CHUNKS=1 attn_decode --bench --shapes lc_q20_w8_b121 > $OUT/kern_new_1.log 2>&1
  QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 ATTN_CHUNKS=1 attn_decode --bench \
    --shapes lc_q20_w8_b121 > $OUT/kern_old_1.log 2>&1
  grep -H '"auto": true' $OUT/kern_*.log |
    grep -o 'kern_[a-z]*_[0-9].log\|"chunks_per_seq": [0-9]*\|"ms_gpu": [0-9.]*' | paste - - - |
    tee $OUT/kern.txt
fi
echo "done at $SECONDS s"
