#!/usr/bin/env bash
# build: configures (once) and builds qevict into ./build. CUDA sources are compiled whenever
# nvcc is found (on PATH or in /usr/local/cuda/bin). Extra meson options can be passed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [[ ! -f build/build.ninja ]]; then
  meson setup build "$@" >&2
fi
ninja -C build >&2
