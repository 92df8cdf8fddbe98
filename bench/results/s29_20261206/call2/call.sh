# Twenty-ninth session, call 2: attn_block again after its second form (a tile's descriptors
# loaded a tile ahead, the next tile's copies issued before the tile's work; the variants t64s2,
# t64s3, t128s2): checks, then the bench against the tree's kernel. Carry carry/pack.
export PACK=carry/pack
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
source bench/device_unpack.sh
timeout 200 attn_block > $OUT/check.log 2>&1
echo "attn_block check rc $?"
grep -E "^variant|FAIL|failures" $OUT/check.log | head -30
timeout 240 attn_block --bench --rounds 5 > $OUT/bench.log 2>&1
echo "attn_block bench rc $?"
grep -v '^{' $OUT/bench.log
echo "done at $SECONDS s"
