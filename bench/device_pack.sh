#!/usr/bin/env bash
# device_pack.sh: packs what a device call needs and the device lacks into carry/pack (ignored;
# name it in `carry`): the CUDA + serving build's binaries (qevict, which is also qevictd and
# qevict-sched by its name, long_ctx, test_kv_gpu, test_kern_cuda, test_kc_quant,
# test_model_graph, attn_decode), xz-compressed,
# and the shared libraries of gRPC, libuv, protobuf-c and SQLite they link (the device has none
# of them), from this Debian 12 machine. bench/device_unpack.sh undoes it there.
# Usage (repo root): bench/device_pack.sh [BUILD_DIR]   (default build-srv-dev: -Dcuda=enabled
#   -Dserving=enabled -Dblas=disabled -Dnative=false, built first)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-srv-dev}
PACK=carry/pack
[[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" -Dcuda=enabled -Dserving=enabled \
  -Dblas=disabled -Dnative=false >/dev/null
ninja -C "$BUILD" cli/qevict bench/long_ctx tests/kernels/test_kv_gpu \
  tests/kernels/test_kern_cuda tests/kernels/test_kc_quant tests/kernels/test_model_graph \
  tests/kernels/attn_decode >/dev/null
rm -rf "$PACK" && mkdir -p "$PACK"
for b in cli/qevict bench/long_ctx tests/kernels/test_kv_gpu tests/kernels/test_kern_cuda \
  tests/kernels/test_kc_quant tests/kernels/test_model_graph tests/kernels/attn_decode; do
  strip -o "$PACK/$(basename "$b")" "$BUILD/$b"
  xz -T0 -6 "$PACK/$(basename "$b")"
done
# Libraries outside glibc, the compiler's runtime, zlib and CUDA (the device has those); OpenSSL
# separately (used there only when the device has no libssl.so.3).
T=$(mktemp -d)
mkdir -p "$T/lib" "$T/libssl"
ldd "$BUILD/cli/qevict" | awk '/=> \// {print $3}' | sort -u | while read -r l; do
  case "$(basename "$l")" in
    libc.so* | libm.so* | libpthread.so* | librt.so* | libdl.so* | libstdc++* | libgcc_s* | libz.so*) ;;
    libcuda* | libcudart* | libcublas* | libnccl*) ;;
    libssl.so* | libcrypto.so*) cp -L "$l" "$T/libssl/" ;;
    *) cp -L "$l" "$T/lib/" ;;
  esac
done
tar -C "$T" -cJf "$PACK/libs.tar.xz" lib libssl
rm -rf "$T"
du -sh "$PACK"
