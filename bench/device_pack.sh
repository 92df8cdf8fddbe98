#!/usr/bin/env bash
# device_pack.sh: packs what a device call needs and the device lacks into carry/pack (ignored;
# name it in `carry`): the CUDA + serving build's binaries (qevict, which is also qevictd and
# qevict-sched by its name, long_ctx, test_kv_gpu, test_kern_cuda, test_kc_quant,
# test_model_graph, attn_decode, attn_block), xz-compressed,
# and the shared libraries of gRPC, libuv, protobuf-c and SQLite they link (the device has none
# of them), from this Debian 12 machine. bench/device_unpack.sh undoes it there.
# Usage (repo root): bench/device_pack.sh [BUILD_DIR]   (default build-srv-dev: -Dcuda=enabled,
#   sm_90 alone (-Dgpu_sm=90 -Dgpu_ptx=false),
#   -Dserving=enabled -Dblas=disabled -Dnative=false -Dc_args=-march=x86-64-v3, built first);
#   PACK_DIR (default carry/pack) and PACK_BINS ("cli/qevict tests/kernels/test_kv_gpu ...",
#   default all of the above) choose where and what
#   bench/device_pack.sh --cpu   (the CPU build with OpenBLAS into carry/pack_cpu; see below)
#   VARIANTS="NAME=FLAGS;..." bench/device_pack.sh --variants   (test_kern_cuda variants; below)
set -euo pipefail
cd "$(dirname "$0")/.."

# Copies the shared libraries BIN links, outside glibc, the compiler's runtime, zlib and CUDA
# (the device has those), into OUT/libs.tar.xz; OpenSSL separately (used there only when the
# device has no libssl.so.3).
pack_libs() { # BIN OUT
  local T l
  T=$(mktemp -d)
  mkdir -p "$T/lib" "$T/libssl"
  ldd "$1" | awk '/=> \// {print $3}' | sort -u | while read -r l; do
    case "$(basename "$l")" in
      libc.so* | libm.so* | libpthread.so* | librt.so* | libdl.so* | libstdc++* | libgcc_s* | libz.so*) ;;
      libcuda* | libcublas* | libnccl*) ;; # (libcuda* takes libcudart too)
      libssl.so* | libcrypto.so*) cp -L "$l" "$T/libssl/" ;;
      *) cp -L "$l" "$T/lib/" ;;
    esac
  done
  tar -C "$T" -cJf "$2/libs.tar.xz" lib libssl
  rm -rf "$T"
}

# Meson 1.0's nvcc rule records no header dependencies, so a CUDA object older than a header it
# includes would survive a change of that header (a stale kern_ops_t table made every GPU binary
# crash, 2026-12-02): such objects are deleted before a build.
drop_stale_cuda() { # BUILD
  local newest
  newest=$(find common kernels cache model transport \( -name '*.h' -o -name '*.cuh' \) \
    -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
  [[ -d $1 && -n $newest ]] && find "$1" -name '*.cu.o' ! -newer "$newest" -delete
  return 0
}

pack_bin() { # BUILD TARGET PACK: stripped and xz-compressed
  strip -o "$3/$(basename "$2")" "$1/$2"
  xz -T0 -6 "$3/$(basename "$2")"
}

# --cpu: the CPU build with OpenBLAS (for CPU-only evaluations on the device's cores):
# build-cpu-dev (-Dcuda=disabled -Dserving=disabled -Dblas=enabled, x86-64-v3), carry/pack_cpu.
if [[ ${1:-} == --cpu ]]; then
  BUILD=build-cpu-dev PACK=carry/pack_cpu
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" -Dcuda=disabled -Dserving=disabled \
    -Dblas=enabled -Dnative=false -Dc_args=-march=x86-64-v3 >/dev/null
  ninja -C "$BUILD" cli/qevict >/dev/null
  rm -rf "$PACK" && mkdir -p "$PACK"
  pack_bin "$BUILD" cli/qevict "$PACK"
  pack_libs "$BUILD/cli/qevict" "$PACK"
  du -sh "$PACK"
  exit 0
fi

# --variants: test_kern_cuda built once per entry of $VARIANTS ("NAME=NVCC FLAGS;NAME=..." e.g.
# "kt32=-DKCF_KT=32;w8=-DKCF_WARPS=8 -DKCF_MT=1") through NVCC_APPEND_FLAGS, into
# carry/var/tkc_NAME.xz, and this tree's own as tkc_new.xz (bench/gpu_prefill_ab.sh compares
# them; only kern_cuda_flash.cu is rebuilt per variant: flags for the prefill kernel); the build
# is left as the tree's own.
if [[ ${1:-} == --variants ]]; then
  BUILD=build-srv-dev
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" -Dcuda=enabled -Dserving=enabled \
    -Dblas=disabled -Dnative=false -Dc_args=-march=x86-64-v3 >/dev/null
  drop_stale_cuda "$BUILD"
  mkdir -p carry/var && rm -f carry/var/tkc_*.xz
  IFS=';' read -r -a VS <<< "${VARIANTS:-}"
  for v in "${VS[@]}" "new="; do
    touch kernels/cuda/kern_cuda_flash.cu # (no depfile in the nvcc rule: the flags need a touch)
    NVCC_APPEND_FLAGS="${v#*=}" ninja -C "$BUILD" tests/kernels/test_kern_cuda >/dev/null
    cp "$BUILD/tests/kernels/test_kern_cuda" "carry/var/tkc_${v%%=*}"
    xz -T0 -6 -f "carry/var/tkc_${v%%=*}"
  done
  du -sh carry/var
  exit 0
fi

BUILD=${1:-build-srv-dev}
PACK=${PACK_DIR:-carry/pack}
[[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" -Dcuda=enabled -Dserving=enabled \
  -Dblas=disabled -Dnative=false -Dc_args=-march=x86-64-v3 >/dev/null
# sm_90 machine code alone (the device's H100 and H200): a third of the sm_80 + sm_90 + PTX
# binaries, so that a pack and the repository fit one call's carry
meson configure "$BUILD" -Dgpu_sm=90 -Dgpu_ptx=false >/dev/null
drop_stale_cuda "$BUILD"
BINS=(cli/qevict bench/long_ctx tests/kernels/test_kv_gpu tests/kernels/test_kern_cuda
  tests/kernels/test_kc_quant tests/kernels/test_model_graph tests/kernels/attn_decode
  tests/kernels/attn_block)
[[ -n ${PACK_BINS:-} ]] && read -r -a BINS <<< "$PACK_BINS"
ninja -C "$BUILD" "${BINS[@]}" >/dev/null
rm -rf "$PACK" && mkdir -p "$PACK"
for b in "${BINS[@]}"; do pack_bin "$BUILD" "$b" "$PACK"; done
pack_libs "$BUILD/cli/qevict" "$PACK"
du -sh "$PACK"
