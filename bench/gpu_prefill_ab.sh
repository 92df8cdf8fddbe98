#!/usr/bin/env bash
# gpu_prefill_ab.sh: the fused prefill kernel's variants side by side, in one device call. With
# carry/pack (bench/device_pack.sh) and carry/var: test_kern_cuda builds of the variants as
# tkc_NAME.xz (new = this tree's, others built with NVCC_APPEND_FLAGS=-DKCF_...: both by
# `VARIANTS=... bench/device_pack.sh --variants`; an older kernel's build copied in by hand) and
# optionally qevict_base.xz (an older tree's qevict, for the TTFT rows).
#   checks  test_kern_cuda --attention (this tree's kernel against the CPU backend, fresh random
#           data); memcheck and racecheck on --fused; racecheck on --chunks (the GEMM path)
#   kernel  test_kern_cuda --prefill-bench of every variant, two rounds alternating (one layer's
#           attention, 1 x 32K and 32 x 256)
#   ttft    qevict generate, 8B shape, 1 x 32K (FullKV, QEvict 20%) and 32 x 256, this tree
#           against qevict_base; QEvict 20% with QE_CUDA_MASS=ref (mass queries by the reference)
# Usage (repo root, device): OUT=DIR bench/gpu_prefill_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-bench/out/gpu_prefill_ab}
mkdir -p "$OUT" /tmp/var
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh > /dev/null || exit 1
for f in carry/var/*.xz; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    "$f" "/tmp/var/$(basename "$f" .xz)"
done
chmod +x /tmp/var/*
timeout 300 test_kern_cuda --attention > "$OUT/test_kern_cuda.log" 2>&1
echo "test_kern_cuda --attention rc $?"
grep -E "^FAIL|fused|gemm path" "$OUT/test_kern_cuda.log" | head -24
for r in 1 2; do
  for v in /tmp/var/tkc_*; do
    n=$(basename "$v")
    echo "$n round $r: $(timeout 60 "$v" --prefill-bench 2> /dev/null | tr '\n' ' ')"
  done
done | tee "$OUT/prefill_bench.log"
for tool in memcheck racecheck; do
  timeout "${SAN_S:-120}" compute-sanitizer --tool $tool test_kern_cuda --fused \
    > "$OUT/$tool.log" 2>&1
  echo "$tool --fused rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
done
# racecheck on the GEMM path's chunked case: whole, then only our kernels instrumented
for filt in "" "--kernel-name kns=kcu_" "--kernel-name-exclude kns=gemm"; do
  # shellcheck disable=SC2086
  timeout 120 compute-sanitizer --tool racecheck $filt test_kern_cuda --chunks \
    > "$OUT/racecheck_chunks.log" 2>&1
  echo "racecheck $filt --chunks rc $?: $(grep -E 'RACECHECK SUMMARY|Error' "$OUT/racecheck_chunks.log" | tr '\n' ' ')"
done
gen() { # NAME BIN args...
  local name=$1 bin=$2
  shift 2
  timeout 200 "$bin" generate --shape llama3-8b --device 0 --json --ignore-eos -n 2 "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc $? prefill_s $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['prefill_s'])" "$OUT/$name.json" 2> /dev/null)"
}
[[ -x /tmp/var/qevict_base ]] && for b in new base; do
  bin=qevict
  [[ $b == base ]] && bin=/tmp/var/qevict_base
  gen "b1_32k_full_$b" $bin --batch 1 --prompt-len 32768
  gen "b1_32k_q20_$b" $bin --batch 1 --prompt-len 32768 --policy qevict --budget 0.2
  gen "b32_256_full_$b" $bin --batch 32 --prompt-len 256
done
# the mass queries by the reference kernel (QE_CUDA_MASS=ref; the GEMM path is the default)
QE_CUDA_MASS=ref gen b1_32k_q20_massref qevict --batch 1 --prompt-len 32768 --policy qevict \
  --budget 0.2
QE_CUDA_MASS=ref gen b32_256_q20_massref qevict --batch 32 --prompt-len 256 --policy qevict \
  --budget 0.2
