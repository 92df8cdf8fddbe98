#!/bin/sh
# gpu_attn_ab.sh: variants of the decode-attention kernel against a baseline, in one device call.
# Builds tests/kernels/attn_decode from this tree once per variant (VARIANTS: space-separated
# NAME=NVCC_FLAGS, flags joined with ',' e.g. "minb2=-DKCA_MINB=2"; default: one variant "new"
# with no flags) and, when carry/base_src holds a baseline's kernels/cuda files
# (kern_cuda_attn.cu and its kern_cuda_attn_*.cuh), from a copy of the tree with those swapped in;
# checks every variant against the fp64 CPU reference; times all of them on the shapes whose
# name contains SHAPES (attn_decode --bench), two rounds alternating; with PROF=1 profiles the
# first variant's chunk kernel on the shapes of PROF_SHAPES (default: the two tiered ones at 32K)
# with Nsight Compute (ncu, clocks left alone).
# Logs under $OUT: check_NAME.log, bench_NAME_N.log, ncu_*.txt/csv.
# Usage (repo root, device): VARIANTS="a=-DX=1 b=-DX=2" sh bench/gpu_attn_ab.sh
set -u
OUT=${OUT:-$(pwd)/bench/out/gpu_attn_ab}
SHAPES=${SHAPES:-s32768}
VARIANTS=${VARIANTS:-new=}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
ROOT=$(pwd)
build() { # $1 source tree, $2 build dir, $3 log, $4 extra nvcc flags
  (cd "$1" && export NVCC_APPEND_FLAGS="$4" && { [ -f "$2/build.ninja" ] ||
    meson setup "$2" -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false; } &&
    ninja -C "$2" tests/kernels/attn_decode) > "$3" 2>&1 || { tail -30 "$3"; exit 1; }
}
echo "== build"
NAMES=
for v in $VARIANTS; do
  name=${v%%=*} flags=$(echo "${v#*=}" | tr ',' ' ')
  build "$ROOT" "build-ab-$name" "$OUT/build_$name.log" "$flags" &
  NAMES="$NAMES $name"
done
if [ -d carry/base_src ]; then
  rm -rf /tmp/ab-base && mkdir -p /tmp/ab-base
  tar --exclude='./build*' --exclude=./carry -cf - . | tar -xf - -C /tmp/ab-base
  cp carry/base_src/* /tmp/ab-base/kernels/cuda/
  build /tmp/ab-base build-ab-base "$OUT/build_base.log" "" &
fi
wait
bin() { [ "$1" = base ] && echo /tmp/ab-base/build-ab-base/tests/kernels/attn_decode ||
  echo "$ROOT/build-ab-$1/tests/kernels/attn_decode"; }
[ -d carry/base_src ] && NAMES="$NAMES base"
for n in $NAMES; do [ -x "$(bin "$n")" ] || { echo "build $n failed"; exit 1; }; done
echo "== check"
for n in $NAMES; do
  "$(bin "$n")" > "$OUT/check_$n.log" 2>&1
  echo "$n: rc $? $(grep -E '^attn_decode check: [0-9]+ case' "$OUT/check_$n.log")"
done
echo "== bench"
for i in 1 2; do
  for n in $NAMES; do "$(bin "$n")" --bench --shapes "$SHAPES" > "$OUT/bench_${n}_$i.log" 2>&1; done
done
FIRST=$(echo $NAMES | cut -d' ' -f1)
if [ "${PROF:-0}" = 1 ] && command -v ncu > /dev/null 2>&1; then
  echo "== ncu ($FIRST)"
  for sh in ${PROF_SHAPES:-tiered20_b8 tiered20_w8_b8}; do
    ncu --clock-control none --set full -k regex:kca_chunk_kernel --launch-skip 12 \
      --launch-count 1 --page source --print-source sass --csv "$(bin "$FIRST")" --bench \
      --shapes "$sh" > "$OUT/ncu_src_$sh.csv" 2>&1
  done
fi
echo "== summary (best ms per shape, ratio to FullKV)"
for f in "$OUT"/bench_*.log; do
  echo "$(basename "$f" .log): $(grep -E '^(full|tiered|abs_)' "$f" | awk '{printf "%s %s %s  ", $1, $2, $6}')"
done
