# Thirtieth session, call 2: the 16-byte copies' L2 prefetch size (cp.async ... .L2::128B /
# .L2::256B; builds with -DKCA_L2HINT=N -DFB_L2HINT=N, packed as attn_decode_hN, attn_block_hN)
# against the tree's (no hint): the tree's kernels at FullKV (no masses) and tiered 20%, and
# attn_block, two rounds alternating. Carry carry/pk2 (attn_decode, attn_block and their variants from carry/pack, long_ctx and libs.tar.xz).
export PACK=carry/pk2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
S=full_b32_s1280,full_b8_s32768,full_b32_s32768,abs_tiered20_w8_b8_s32768,abs_tiered20_w8_b32_s32768
for r in 1 2; do
  for v in "" _h128 _h256; do
    timeout 200 attn_decode$v --bench --shapes $S > $OUT/attn_r${r}$v.log 2>&1
    echo "attn_decode$v r$r rc $?"
    grep -h '^{"bench"' $OUT/attn_r${r}$v.log | grep -v '"auto": false' | grep -v hot_ |
      grep -o '"bench": "[a-z0-9_]*"\|"ms_gpu": [0-9.]*' | paste - - | grep -v read_only
  done
done
for v in "" _h128 _h256; do
  timeout 200 attn_block$v --bench --rounds 3 > $OUT/block$v.log 2>&1
  echo "attn_block$v rc $?"; grep -v '^{' $OUT/block$v.log | grep -v ^variant | grep "tree \|t64s2w4"
done
echo "done at $SECONDS s"
# On an H200, the twenty-eighth session's owed call as well (it stops at once on another card).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) PACK=carry/pk2 bash bench/results/s28_20261206/call1/call.sh ;;
esac
