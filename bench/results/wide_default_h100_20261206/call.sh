# call 3 (2026-12-06, twenty-sixth session; owed: it never started, the session's device time
# ran out): the wide tiered chunking (KC_ATTN_SPLIT_WIDE 4 chunks, lead 300 permille,
# chunk-major) as the default. Checks (attn_decode with its wide case, test_model_graph,
# test_kv_gpu, test_kc_quant) and long_ctx QEvict + FullKV through bench/gpu_longctx_ab.sh;
# QEvict again under the old rule (QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0); the kernel at
# 121 x 32K new / old, two rounds. Carry carry/pack (bench/device_pack.sh).
export PACK=carry/pack
LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=new bash bench/gpu_longctx_ab.sh
QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 CHECKS=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS=qevict \
  TAG=old bash bench/gpu_longctx_ab.sh
source bench/device_unpack.sh
for r in 1 2; do
  ATTN_CHUNKS=1 attn_decode --bench --shapes lc_q20_w8_b121 > $OUT/kern_new_$r.log 2>&1
  QE_CUDA_ATTN_SPLIT=2 QE_CUDA_ATTN_LEAD=0 ATTN_CHUNKS=1 attn_decode --bench \
    --shapes lc_q20_w8_b121 > $OUT/kern_old_$r.log 2>&1
done
grep -H '"auto": true' $OUT/kern_*.log | grep -o 'kern_[a-z]*_[0-9].log\|"chunks_per_seq": [0-9]*\|"ms_gpu": [0-9.]*' |
  paste - - - | tee $OUT/kern.txt
