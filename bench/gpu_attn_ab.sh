#!/bin/sh
# gpu_attn_ab.sh: the decode-attention kernel of this tree against a baseline, in one device call.
# Builds tests/kernels/attn_decode from this tree and, when carry/base_src holds a baseline's
# kernels/cuda files (kern_cuda_attn.cu, kern_cuda_attn_dev.cuh), from a copy of the tree with
# those files swapped in; checks the new kernel against the fp64 CPU reference; times both on the
# FullKV and tiered 20% shapes (attn_decode --bench), alternating A B A B; with PROF=1 also
# profiles the tiered kernels of this tree with Nsight Compute (ncu, clocks left alone).
# Logs under $OUT: check.log, bench_new_N.log, bench_base_N.log, regs.log, ncu_*.txt.
# Usage (repo root, device): sh bench/gpu_attn_ab.sh
set -u
OUT=${OUT:-$(pwd)/bench/out/gpu_attn_ab}
SHAPES=${SHAPES:-s32768}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
ROOT=$(pwd)
build() { # $1 source tree, $2 build dir, $3 log
  (cd "$1" && { [ -f "$2/build.ninja" ] ||
    meson setup "$2" -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false; } &&
    ninja -C "$2" tests/kernels/attn_decode) > "$3" 2>&1 || { tail -30 "$3"; exit 1; }
}
echo "== build"
build "$ROOT" build-ab-new "$OUT/build_new.log"
NEW=$ROOT/build-ab-new/tests/kernels/attn_decode
BASE=
if [ -d carry/base_src ]; then
  rm -rf /tmp/ab-base && mkdir -p /tmp/ab-base
  tar --exclude='./build*' --exclude=./carry -cf - . | tar -xf - -C /tmp/ab-base
  cp carry/base_src/* /tmp/ab-base/kernels/cuda/
  build /tmp/ab-base build-ab-base "$OUT/build_base.log"
  BASE=/tmp/ab-base/build-ab-base/tests/kernels/attn_decode
fi
nvcc -c -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas -v -Icommon -Ikernels \
  -Ikernels/cuda kernels/cuda/kern_cuda_attn.cu -o /tmp/kca_regs.o > "$OUT/regs.log" 2>&1
grep -A1 "kca_chunk_kernelILi128ELi2" "$OUT/regs.log" | grep -E "Used|spill" | head -8
echo "== check (new)"
"$NEW" > "$OUT/check.log" 2>&1
echo "check rc $?"
grep -E "^(FAIL|attn_decode)" "$OUT/check.log" | tail -5
echo "== bench"
for i in 1 2; do
  "$NEW" --bench --shapes "$SHAPES" > "$OUT/bench_new_$i.log" 2>&1
  [ -n "$BASE" ] && "$BASE" --bench --shapes "$SHAPES" > "$OUT/bench_base_$i.log" 2>&1
done
if [ "${PROF:-0}" = 1 ] && command -v ncu > /dev/null 2>&1; then
  echo "== ncu"
  for sh in tiered20_b8 tiered20_w8; do
    ncu --clock-control none --set full --import-source yes -k regex:kca_chunk_kernel \
      --launch-skip 12 --launch-count 1 "$NEW" --bench --shapes "$sh" > "$OUT/ncu_$sh.txt" 2>&1
    ncu --clock-control none --set full -k regex:kca_chunk_kernel --launch-skip 12 \
      --launch-count 1 --page source --print-source sass --csv "$NEW" --bench --shapes "$sh" \
      > "$OUT/ncu_src_$sh.csv" 2>&1
    grep -E "Duration|Issued Ipc|Achieved Occupancy|Registers Per|Theoretical Occ|Warp Cycles Per Issued|Stall|No Eligible|Eligible Warps|Executed Instructions  " \
      "$OUT/ncu_$sh.txt" | head -30
  done
fi
echo "== summary (best ms per shape: new, base)"
for f in "$OUT"/bench_new_*.log "$OUT"/bench_base_*.log; do
  [ -f "$f" ] && echo "$(basename "$f"): $(grep -E '^(full|tiered)' "$f" | awk '{printf "%s %s %s  ", $1, $2, $6}')"
done
