# Twenty-ninth session, call 4: attn_block with the warps a block as a parameter (t64s2w4 is call
# 3's t64s2; t32s2w2 and t32s3w2: two warps sharing 32-token tiles, 6 and 4 blocks a
# multiprocessor; t64s2w2: two warps of 32 keys each, cuDNN's keys a warp; t128s2w8: eight warps
# of 16): checks, then the bench against the tree's kernel. Carry carry/pack.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
timeout 200 attn_block > $OUT/check.log 2>&1
echo "attn_block check rc $?"
grep -E "^variant|FAIL|failures" $OUT/check.log | head -30
timeout 240 attn_block --bench --rounds 5 > $OUT/bench.log 2>&1
echo "attn_block bench rc $?"
grep -v '^{' $OUT/bench.log | grep -v ^variant
echo "done at $SECONDS s"
