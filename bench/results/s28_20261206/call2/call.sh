# Twenty-eighth session (2026-12-06), call 2: test_kv_gpu with the new short-slot cases (a sink
# or local region of 4,096 tokens over 100-token slots opened with their own FullKV budget,
# against the FullKV GPU cache), and compute-sanitizer memcheck over test_kv_gpu --small (which
# runs them too). On an H200 then, the owed figures of call 1 (long_ctx both policies, and the
# decode-attention table with cuDNN). Carry carry/pack (bench/device_pack.sh, tree c7450df).
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $G"
source bench/device_unpack.sh
timeout 300 test_kv_gpu > $OUT/kv_gpu.log 2>&1; echo "test_kv_gpu rc $?: $(tail -1 $OUT/kv_gpu.log)"
grep -E 'short slot|FAIL' $OUT/kv_gpu.log
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 400 $CS --tool memcheck --error-exitcode 9 test_kv_gpu --small > $OUT/memcheck.log 2>&1
echo "memcheck test_kv_gpu --small rc $?: $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)"
case "$G" in *H200*) ;; *) echo "done at $SECONDS s"; exit 0 ;; esac
CHECKS=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc bash bench/gpu_longctx_ab.sh
bash bench/gpu_peer_table.sh
echo "done at $SECONDS s"
