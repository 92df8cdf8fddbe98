#!/usr/bin/env bash
# run: the whole test suite. Builds (release) and runs every unit and integration test, then
# the unit tests again under ASan/UBSan, then the GGUF fuzzer for a short while.
# Needs deploy/install-deps.sh to have run. Set QE_FUZZ_SECONDS (default 60) to change the
# fuzzing time, QE_SKIP_SANITIZE=1 / QE_SKIP_FUZZ=1 to skip those stages locally.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

step() { printf '\n== %s\n' "$*" >&2; }

step "format (clang-format, .clang-format)"
git ls-files '*.c' '*.h' | xargs clang-format --dry-run -Werror

step "build"
deploy/build.sh

step "fetch SmolLM2-135M-Instruct (cached)"
deploy/fetch-model.sh >/dev/null

step "unit and integration tests"
meson test -C build --print-errorlogs --num-processes 2

if [[ "${QE_SKIP_SANITIZE:-0}" != 1 ]]; then
  step "unit tests under ASan/UBSan"
  if [[ ! -f build-asan/build.ninja ]]; then
    meson setup build-asan -Dbuildtype=debugoptimized -Db_sanitize=address,undefined \
      -Db_lundef=false -Dcuda=disabled -Dpedantic_errors=true >&2
  fi
  ninja -C build-asan >&2
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --print-errorlogs --num-processes 2 --suite unit
fi

if [[ "${QE_SKIP_FUZZ:-0}" != 1 ]]; then
  if [[ ! -f build-fuzz/build.ninja ]]; then
    CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
      -Dcuda=disabled -Dblas=disabled >&2
  fi
  ninja -C build-fuzz tests/fuzz/fuzz_gguf >&2
  if ninja -C build-fuzz -t targets all | grep -q '^tests/fuzz/fuzz_frame:'; then
    ninja -C build-fuzz tests/fuzz/fuzz_frame >&2
  fi
  if ninja -C build-fuzz -t targets all | grep -q '^tests/fuzz/fuzz_http:'; then
    ninja -C build-fuzz tests/fuzz/fuzz_http >&2
  fi
  fuzz() { # NAME SECONDS SEED_CORPUS
    step "fuzzing $1 ($2 s)"
    mkdir -p "build-fuzz/corpus-$1"
    "build-fuzz/tests/fuzz/$1" -max_total_time="$2" -max_len=65536 -print_final_stats=1 \
      "build-fuzz/corpus-$1" "$3" >&2
  }
  fuzz fuzz_gguf "${QE_FUZZ_SECONDS:-60}" "$ROOT/tests/fuzz/corpus"
  if [[ -x build-fuzz/tests/fuzz/fuzz_frame ]]; then
    fuzz fuzz_frame "${QE_FUZZ_SECONDS:-30}" "$ROOT/tests/fuzz/corpus_frame"
  fi
  if [[ -x build-fuzz/tests/fuzz/fuzz_http ]]; then
    fuzz fuzz_http "${QE_FUZZ_SECONDS:-20}" "$ROOT/tests/fuzz/corpus_http"
  fi
fi
step "all tests passed"
