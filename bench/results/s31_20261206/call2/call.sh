# Thirty-first session (2026-12-06), call 2: the H200 figures of the tree (7ad1ac0's GPU code: the
# wide rule and the 256-byte L2 prefetch as defaults). On an H200 only (other cards stop at once):
# long_ctx at 32K, 200 new tokens, QEvict 20% then FullKV; the decode-attention table (FullKV
# B=32 S=1280, B=8 32K, B=32 32K; tiered 20% w8 B=8 and B=32 32K) with torch SDPA cuDNN queued the
# same way, two rounds; then long_ctx QEvict of the -DKCA_L2HINT=0 build (long_ctx_base).
# Carry carry/pack (as call 1's, less attn_decode_base).
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing to run"; exit 0 ;; esac
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc \
  bash bench/gpu_longctx_ab.sh
echo "long_ctx done at $SECONDS s"
source bench/device_unpack.sh
S=full_b32_s1280,full_b8_s32768,full_b32_s32768,abs_tiered20_w8_b8_s32768,abs_tiered20_w8_b32_s32768
for r in 1 2; do
  attn_decode --bench --shapes $S > $OUT/attn_$r.log 2>&1
  python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > $OUT/sdpa_$r.log 2>&1
done
python3 - $OUT/attn_*.log <<'PY' | tee $OUT/attn.txt
import json, sys
for f in sys.argv[1:]:
    for ln in open(f):
        if ln.startswith('{"bench"') and '"auto": false' not in ln:
            d = json.loads(ln)
            print(f.rsplit('/', 1)[1], d["bench"], d.get("chunks_per_seq", ""), d.get("ms_gpu"),
                  d.get("frac_copy_bw_gpu", ""))
PY
grep -h 'ms_gpu' $OUT/sdpa_*.log | tee $OUT/sdpa.txt
echo "peer table done at $SECONDS s"
CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx_base POLS=qevict TAG=lc_base bash bench/gpu_longctx_ab.sh
echo "done at $SECONDS s"
