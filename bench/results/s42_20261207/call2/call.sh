# Forty-second session (2026-12-07), call 2, on any card (right after call 1 on the same machine
# when it is warm): test_kern_cuda (the greedy argmax now gives -1 for a row of NaN, +inf or only
# -inf; not run on a GPU before), then the forty-first session's call 1 (serve_gpu.sh rand at
# 512M, 40% and with no --pool-bytes, whose workers take 40% of the free device memory;
# test_kv_gpu, test_model_graph; a lone worker's warning at --pool-bytes 60%). Carry carry/pack
# (bench/device_pack.sh with PACK_BINS="cli/qevict tests/unit/rand_gguf tests/kernels/test_kv_gpu
# tests/kernels/test_model_graph tests/kernels/test_kern_cuda bench/long_ctx
# tests/kernels/attn_decode", plus long_ctx_base for call 1).
export PACK=carry/pack
source bench/device_unpack.sh || exit 1
O=${OUT:-/tmp/out}/s42c2
mkdir -p "$O"
timeout 240 test_kern_cuda >"$O/test_kern_cuda.log" 2>&1
echo "test_kern_cuda rc $?: $(tail -1 "$O/test_kern_cuda.log")"
grep -E 'FAIL|argmax' "$O/test_kern_cuda.log" | head -5
bash bench/results/s41_20261207/call1/call.sh
O2=${OUT:-/tmp/out}; rm -f "$O2/s41c1/rand.gguf"; tar -C "$O2" -czf "$O2/s42c2.tgz" s42c2 s40c1 s41c1 && rm -rf "$O2"/s4[012]c[12]
echo "call 2 done at $SECONDS s"
