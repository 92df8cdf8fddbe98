#!/usr/bin/env bash
# pack_revs.sh: builds one binary of earlier revisions for a device A/B and packs them beside this
# tree's into carry/revs (ignored; carry it whole): libs.tar.xz and the tree's binary from
# carry/pack (bench/device_pack.sh first), and NAME_REV.xz for each REV (its short hash), so that
#   PACK=carry/revs BINS="long_ctx_2f011be long_ctx" POLS=qevict NEW=200 LC=0 \
#     bash bench/gpu_longctx_ab.sh
# times them in one call (bench/gpu_longctx_ab.sh's BINS: any packed long_ctx names).
# Each REV builds in its own worktree (/tmp/qe_rev_REV, kept for the next call) with the CUDA
# code for sm_90 alone, as device_pack.sh builds the tree: -Dgpu_sm=90 -Dgpu_ptx=false where the
# revision has those options, else its kernels/meson.build's sm_80 and PTX targets are dropped in
# the worktree (the same code, a third of the binary, so that a pack of several fits a call).
# Usage (repo root): bench/pack_revs.sh [-t TARGET] REV...   (TARGET: bench/long_ctx by default,
#   or e.g. tests/kernels/attn_decode)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=bench/long_ctx
if [[ ${1:-} == -t ]]; then TARGET=$2; shift 2; fi
[[ $# -ge 1 ]] || { echo "usage: bench/pack_revs.sh [-t TARGET] REV..." >&2; exit 2; }
NAME=$(basename "$TARGET") OUT=carry/revs
[[ -f carry/pack/libs.tar.xz && -f carry/pack/$NAME.xz ]] ||
  { echo "pack_revs: run bench/device_pack.sh first (no carry/pack/$NAME.xz)" >&2; exit 1; }
mkdir -p "$OUT"
cp carry/pack/libs.tar.xz "carry/pack/$NAME.xz" "$OUT/"

# Builds TARGET at revision $1 in its worktree; prints the binary's path.
build_rev() {
  local rev=$1 wt=/tmp/qe_rev_$1 b
  [[ -d $wt ]] || git worktree add -f --detach "$wt" "$rev" >/dev/null 2>&1
  b=$wt/build
  if [[ ! -f $b/build.ninja ]]; then
    if grep -q "gpu_sm" "$wt/meson_options.txt"; then
      meson setup "$b" "$wt" -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false \
        -Dc_args=-march=x86-64-v3 -Dgpu_sm=90 -Dgpu_ptx=false >/dev/null
    else
      sed -i -e "s/'-gencode=arch=compute_80,code=sm_80', *//g" \
        -e "s/'-gencode=arch=compute_90,code=compute_90', *//g" \
        -e "s/, *'-gencode=arch=compute_90,code=compute_90'//g" "$wt/kernels/meson.build"
      meson setup "$b" "$wt" -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false \
        -Dc_args=-march=x86-64-v3 >/dev/null
    fi
  fi
  ninja -C "$b" "$TARGET" >/dev/null
  echo "$b/$TARGET"
}

for rev in "$@"; do
  short=$(git rev-parse --short=7 "$rev")
  bin=$(build_rev "$short")
  strip -o "$OUT/${NAME}_$short" "$bin"
  xz -T0 -6 -f "$OUT/${NAME}_$short"
  echo "packed $OUT/${NAME}_$short.xz ($(git log -1 --format=%s "$short" | cut -c1-60))"
done
du -sh "$OUT"
