#!/usr/bin/env bash
# device_checks.sh: compute-sanitizer over the GPU tests (memcheck of test_kern_cuda, which
# covers the GEMM prefill path; memcheck and racecheck of test_kv_gpu --small, which covers the
# routing kernels), with the binaries of carry/pack. Prints one line per run and the sanitizer's
# summaries. Usage (repo root, on the device): bench/device_checks.sh
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh || exit 1
export QE_SHARED_MODELS=$(pwd)/carry/models
run() { # NAME TOOL BIN ARGS...
  local name=$1 tool=$2 bin=$3
  shift 3
  timeout 280 compute-sanitizer --tool "$tool" "$bin" "$@" > "/tmp/$name.log" 2>&1
  echo "$name rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard' "/tmp/$name.log" | tail -1)"
  grep -E "^FAIL" "/tmp/$name.log" | head -3
}
run memcheck_kern_cuda memcheck "$(command -v test_kern_cuda)"
run memcheck_kv_gpu memcheck "$(command -v test_kv_gpu)" --small
run racecheck_kv_gpu racecheck "$(command -v test_kv_gpu)" --small
