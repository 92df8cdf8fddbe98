# Thirty-second session (2026-12-06), call 1. Carry carry/pack (bench/device_pack.sh's pack of
# the tree of 6145b0e, plus long_ctx_base: the same sources with -DKCA_L2HINT=0) and carry/var
# (VARIANTS="l2=-DKCF_L2HINT=256" bench/device_pack.sh --variants).
# On an H200: the thirty-first session's owed call 2 (long_ctx at 32K, 200 new, QEvict 20% then
# FullKV; the decode-attention table with torch SDPA cuDNN queued alike, two rounds; long_ctx
# QEvict without the L2 prefetch).
# On any other card: the prefill kernel's 256-byte L2 prefetch (KCF_L2HINT) against the tree's
# kernel: test_kern_cuda --attention of both builds (against the CPU backend, fresh random data),
# then --prefill-bench, three rounds alternating.
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in
  *H200*)
    CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx POLS="qevict full" TAG=lc \
      bash bench/gpu_longctx_ab.sh
    echo "long_ctx done at $SECONDS s"
    bash bench/gpu_peer_table.sh
    echo "peer table done at $SECONDS s"
    CHECKS=0 LC=0 ROUNDS=1 NEW=200 BINS=long_ctx_base POLS=qevict TAG=lc_base \
      bash bench/gpu_longctx_ab.sh
    ;;
  *)
    source bench/device_unpack.sh > /dev/null || exit 1
    mkdir -p /tmp/var
    for f in carry/var/*.xz; do
      python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
        "$f" "/tmp/var/$(basename "$f" .xz)"
    done
    chmod +x /tmp/var/*
    for v in new l2; do
      timeout 240 /tmp/var/tkc_$v --attention > "$OUT/check_$v.log" 2>&1
      echo "tkc_$v --attention rc $? ($(grep -c '^FAIL' "$OUT/check_$v.log") FAIL lines)"
      grep -E "fused" "$OUT/check_$v.log" | head -6
    done
    for r in 1 2 3; do
      for v in new l2; do
        echo "tkc_$v round $r: $(timeout 60 /tmp/var/tkc_$v --prefill-bench 2> /dev/null | tr '\n' ' ')"
      done
    done | tee "$OUT/prefill_bench.log"
    ;;
esac
echo "done at $SECONDS s"
