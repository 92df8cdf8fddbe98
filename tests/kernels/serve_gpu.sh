#!/usr/bin/env bash
# serve_gpu.sh: `qevict serve --device 0` end to end on the GPUs of this machine (issue 5): one
# worker group per GPU, two when two or more GPUs are visible. A tenant with a quota, requests
# under two policies (full; qevict --budget 0.3) submitted at once with `qevict submit`, and
# checks: every request finishes with all its tokens; with two groups both took requests; the
# tenant's reserved bytes, sampled from /metrics and `qevict requests` while they run, never
# exceed its quota (and requests did queue behind it); the GPU memory figures are there; the
# policies the GPU cache cannot run are refused with INVALID_ARGUMENT naming the field, and a
# snapkv request at windows of 8 runs within its budget; a --pool-bytes over the free device memory
# stops a worker at its load. Then the daemon stops. First, on any
# machine: bad --device values fail with a clear message. Bash and the qevict binary only (no
# Python, no curl).
#
# usage: tests/kernels/serve_gpu.sh [MODEL.gguf [QEVICT]]
#   MODEL   a GGUF (default $QE_SMOLLM2, else ~/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf
#           from deploy/fetch-model.sh), or `rand`: a random model that rand_gguf ($RAND_GGUF, else
#           build/tests/unit/rand_gguf) writes, head_dim 64, 4/2 heads, 2 layers, context 4,096 (what
#           a device call can carry: SmolLM2's 98 MB are over its 64 MiB; the tokens are
#           meaningless, every code path is real). On a model whose geometry the GPU kernels do not take
#           (stories260K: head_dim 8) every tiered request must be refused for it instead
#           (policy.name), and FullKV runs without decode graphs (kv_full).
#   QEVICT  the qevict binary (default $QEVICT, else build/cli/qevict)
# Exit: 0 passed, 1 failed, 77 skipped (no GPU visible, a build without CUDA, or no MODEL given and
# none at the default path).
# SERVE_GPU_POOL: the workers' --pool-bytes (default 512M; N% takes a share of the free memory;
# `default` passes none: 40% of the free device memory each, 4 GiB on CPU groups).
# SERVE_GPU_CPU=1 runs the same script on two CPU worker groups (checks the script itself on a
# machine without a GPU; the GPU-only refusals are skipped). SERVE_GPU_TP=T gives each group T
# tensor-parallel ranks (GPUs, over NCCL; two groups when 2T GPUs are visible).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-${QE_SMOLLM2:-$HOME/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf}}
Q=${2:-${QEVICT:-$ROOT/build/cli/qevict}}
CPU=${SERVE_GPU_CPU:-}
TP=${SERVE_GPU_TP:-1}
N_NEW=256
fail=0
bad() { echo "FAIL: $*"; fail=1; }

T=$(mktemp -d /tmp/qevict-serve-gpu-XXXXXX)
SERVE=0
# shellcheck disable=SC2317 # (called by the trap)
cleanup() {
  if ((SERVE > 0)) && kill -0 "$SERVE" 2>/dev/null; then kill "$SERVE"; wait "$SERVE"; fi
  rm -rf "$T"
}
trap cleanup EXIT
if [[ $MODEL == rand ]]; then
  MODEL=$T/rand.gguf
  "${RAND_GGUF:-$ROOT/build/tests/unit/rand_gguf}" "$MODEL" --ctx 4096 --heads 4 --kv 2 \
    --layers 2 || { echo "serve_gpu: rand_gguf failed" >&2; exit 1; }
fi
if [[ ! -r "$MODEL" ]]; then
  [[ $# -ge 1 ]] || { echo "SKIP: no model at $MODEL (deploy/fetch-model.sh, or give one)"; exit 77; }
  echo "serve_gpu: cannot read the model '$MODEL'" >&2
  exit 1
fi
[[ -x "$Q" ]] || { echo "serve_gpu: no qevict binary at '$Q'" >&2; exit 1; }

# GPUs this process may use: nvidia-smi's list, cut to CUDA_VISIBLE_DEVICES when set.
gpu_count() {
  command -v nvidia-smi >/dev/null || { echo 0; return; }
  local n v
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
    v=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c '[0-9]')
    ((v < n)) && n=$v
  fi
  echo "$n"
}

# Bad --device values (any machine): one clear line and a non-zero exit, nothing started.
"$Q" worker --model "$MODEL" --device 255 >/dev/null 2>"$T/err"
rc=$?
if ! { [[ $rc -eq 1 ]] && grep -q 'CUDA device(s) visible' "$T/err"; } &&
  ! { [[ $rc -eq 2 ]] && grep -q 'needs a CUDA build' "$T/err"; }; then
  echo "FAIL: qevictd --device 255: rc $rc: $(cat "$T/err")"
  exit 1
fi
"$Q" serve --model "$MODEL" --device 0 --cpu >/dev/null 2>"$T/err"
rc=$?
if [[ $rc -ne 2 ]] || ! grep -q 'one of --cpu and --device' "$T/err"; then
  echo "FAIL: serve --device 0 --cpu: rc $rc: $(cat "$T/err")"
  exit 1
fi

if [[ -n "$CPU" ]]; then
  WORKERS=2 DEV=(--cpu --threads 1)
else
  n_gpu=$(gpu_count)
  ((n_gpu > 0)) || { echo "SKIP: no GPU visible"; exit 77; }
  ((n_gpu >= TP)) || { echo "SKIP: $n_gpu GPU(s) visible, SERVE_GPU_TP=$TP"; exit 77; }
  WORKERS=$((n_gpu >= 2 * TP ? 2 : 1)) DEV=(--device 0)
fi

# The model's geometry: whether the GPU tiered cache takes it, and a prompt that fits its context.
info=$("$Q" inspect "$MODEL") || { echo "serve_gpu: qevict inspect failed" >&2; exit 1; }
field() { sed -n "s/^$1: *\([0-9]*\).*/\1/p" <<<"$info" | head -1; }
HD=$(field 'head dim') NH=$(field heads) NKV=$(field 'kv heads') CTX=$(field context)
FITS=0
if [[ $HD == 64 || $HD == 128 ]] && ((NH % NKV == 0 && NH / NKV <= 8)); then FITS=1; fi
[[ -n "$CPU" ]] && FITS=1
# (a model the GPU kernels do not take is a tiny one here, stories260K: its 256 tokens took
# ~0.2 s, so the samples below could miss the request that waits for the quota; its prompt
# below takes about half its context)
((FITS)) || N_NEW=$((CTX * 2 / 5))
# (on an H100 the rand model's 8 requests of 256 tokens took ~0.46 s, two samples, and once
# neither sample's /metrics caught a reservation (2026-12-07): 1024 tokens on a GPU)
[[ -z "$CPU" ]] && ((FITS)) && N_NEW=1024
# A --pool-bytes whose KV arena cannot fit the free device memory stops the worker at its load,
# naming the value that fits (before, it started and every request failed at its open).
if [[ -z "$CPU" ]] && ((FITS)); then
  timeout 120 "$Q" worker --model "$MODEL" --device 0 --scheduler "unix:$T/none.sock" --pool-bytes 4096G \
    >/dev/null 2>"$T/err"
  rc=$?
  if [[ $rc -ne 1 ]] || ! grep -q -- '--pool-bytes 4398046511104: its KV arena on cuda:0 takes .* bytes free after loading the model; at most about --pool-bytes [0-9]*M fits' "$T/err"; then
    bad "worker --pool-bytes 4096G on a GPU: rc $rc: $(cat "$T/err")"
  else
    echo "serve_gpu: $(grep -o -- '--pool-bytes 4398046511104.*' "$T/err")"
  fi
  # Without --pool-bytes a GPU worker takes WRK_GPU_POOL_SHARE (40%) of the free device memory.
  QEVICT_LOG=info "$Q" worker --model "$MODEL" --device 0 --scheduler "unix:$T/none.sock" \
    2>"$T/default.log" &
  W=$!
  for _ in $(seq 600); do
    grep -q -- '--pool-bytes 40% of the [0-9]* MiB free: [0-9]* bytes' "$T/default.log" && break
    kill -0 "$W" 2>/dev/null || break
    sleep 0.1
  done
  kill "$W" 2>/dev/null
  wait "$W"
  if grep -q -- '--pool-bytes 40% of the [0-9]* MiB free: [0-9]* bytes' "$T/default.log"; then
    echo "serve_gpu: worker, no --pool-bytes: $(grep -o -- '--pool-bytes 40% of.*' "$T/default.log")"
  else
    bad "a GPU worker without --pool-bytes did not take 40% of the free memory: $(cat "$T/default.log")"
  fi
fi
WORDS=$((CTX / 6 < 600 ? CTX / 6 : 600))
tr -s ' \n' ' ' <"$ROOT/tests/data/towns_2k.txt" | cut -d' ' -f1-"$WORDS" >"$T/prompt.txt"
echo "serve_gpu: $MODEL (head_dim $HD, $NH/$NKV heads, context $CTX), $WORKERS group(s) of TP $TP" \
  "${DEV[*]}, prompt of $WORDS words"

# /metrics through bash's /dev/tcp (HTTP/1.0: the server closes after the body).
metrics() {
  local body
  exec 9<>"/dev/tcp/127.0.0.1/$MPORT" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&9
  body=$(cat <&9)
  exec 9>&-
  printf '%s\n' "$body"
}
metric() { metrics | sed -n "s/^$1 \([0-9.e+]*\)\r*$/\1/p" | head -1; }

POOL=(--pool-bytes "${SERVE_GPU_POOL:-512M}")
[[ ${SERVE_GPU_POOL:-} == default ]] && POOL=()
# Starts serve on two random ports; a port in use shows as an exit within the wait.
start_serve() {
  PORT=$((20000 + RANDOM % 20000)) MPORT=$((PORT + 1))
  rm -f "$T/ready"
  QEVICT_LOG=info "$Q" serve --model "$MODEL" "${DEV[@]}" --workers "$WORKERS" --tp "$TP" --listen "127.0.0.1:$PORT" \
    --metrics-listen "127.0.0.1:$MPORT" --state-dir "$T/state" --ready-file "$T/ready" \
    "${POOL[@]}" --max-seqs 8 2>"$T/serve.log" &
  SERVE=$!
  for _ in $(seq 1200); do # 120 s: loading, CUDA contexts, NCCL
    kill -0 "$SERVE" 2>/dev/null || return 1
    [[ "$(metric 'qevict_workers{state="up"}' 2>/dev/null)" == "$WORKERS" ]] && return 0
    sleep 0.1
  done
  return 1
}
if ! start_serve && ! start_serve; then
  cat "$T/serve.log"
  if grep -q 'needs a CUDA build' "$T/serve.log"; then echo "SKIP: a build without CUDA"; exit 77; fi
  echo "FAIL: qevict serve did not bring $WORKERS group(s) up"
  exit 1
fi
export QEVICT_SERVER=127.0.0.1:$PORT QEVICT_ADMIN_KEY
QEVICT_ADMIN_KEY=$(cat "$T/state/admin.key")
grep -E 'worker .*connected' "$T/serve.log" | sed 's/^/  /'
SHARE=${SERVE_GPU_POOL:-}
[[ $SHARE == default && -z "$CPU" ]] && SHARE=40% # (each rank has a GPU of its own here)
if [[ -n "$CPU" && $SHARE == *% ]]; then # (on the CPU serve splits N% among all the ranks)
  SHARE=$(awk -v n="${SHARE%\%}" -v r=$((WORKERS * TP)) 'BEGIN { printf "%g%%", n / r }')
fi
if [[ $SHARE == *% ]]; then # (a share of the free memory: each worker logs its pool)
  grep -o -- "--pool-bytes $SHARE of the .*" "$T/serve.log" | sed 's/^/  /'
  (($(grep -c -- "--pool-bytes $SHARE of the [0-9]* MiB free: [0-9]* bytes" \
    "$T/serve.log") == WORKERS * TP)) || bad "not every worker logged its --pool-bytes $SHARE"
fi
if [[ -z "$CPU" ]] && ! grep -q 'cuda:' "$T/serve.log"; then bad "no worker registered a cuda device"; fi

"$Q" tenant set gpu-t --quota 4G >"$T/tenant" || { cat "$T/tenant"; exit 1; }
export QEVICT_API_KEY
QEVICT_API_KEY=$(grep '^qk_' "$T/tenant")

# Policies the GPU cache cannot run: refused up front, the field named.
refused() { # FIELD, submit options...
  local field=$1 rc
  shift
  "$Q" submit --prompt "hello" -n 4 "$@" >/dev/null 2>"$T/refused"
  rc=$?
  if [[ $rc -ne 1 ]] || ! grep -q "INVALID_ARGUMENT: $field" "$T/refused"; then
    bad "submit $* on GPU workers: rc $rc, $(cat "$T/refused") (want INVALID_ARGUMENT $field)"
  fi
}
if [[ -z "$CPU" ]] && ((FITS)); then # (a model the tiered cache takes: the field of each cause)
  refused policy.window --policy snapkv --budget 0.3
  refused policy.window --policy pyramidkv --budget 0.3
  refused policy.window --policy h2o --budget 0.3
  refused policy.graphkv --policy qevict --graphkv=0.3,33,1 --budget 0.3
  refused policy.scorer --policy qevict --scorer knorm --budget 0.3
elif [[ -z "$CPU" ]]; then # (any other: its geometry, whatever else the request asks)
  refused policy.name --policy qevict --budget 0.3
  refused policy.name --policy snapkv --budget 0.3
fi

sub() { # OUT, submit options...
  local out=$1
  shift
  "$Q" submit --prompt-file "$T/prompt.txt" -n "$N_NEW" --ignore-eos --json "$@" >"$out" \
    2>"$out.err"
}
num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2" | head -1; }

# One FullKV request alone: its reservation sizes the quota (2.5 of them: requests must queue).
sub "$T/probe" --policy full || { cat "$T/probe.err"; exit 1; }
R_FULL=$(num reserved_bytes "$T/probe")
((R_FULL > 0)) || { bad "the probe request reserved nothing"; exit 1; }
QUOTA=$((R_FULL * 5 / 2))
"$Q" tenant set gpu-t --quota "$QUOTA" >/dev/null || exit 1
echo "serve_gpu: FullKV request reserves $R_FULL bytes; quota $QUOTA"

POLICIES=(full full full full)
((FITS)) && POLICIES+=(qevict qevict qevict qevict)
t_sub=$(date +%s%N)
pids=()
for i in "${!POLICIES[@]}"; do
  p=${POLICIES[$i]}
  if [[ $p == full ]]; then sub "$T/r$i" --policy full & else sub "$T/r$i" --policy qevict --budget 0.3 & fi
  pids+=($!)
done

# Samples the tenant's reserved bytes while the requests run: /metrics and `qevict requests`.
max_res=0 max_sum=0 queued=0 samples=0
running() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while running; do
  m=$(metrics)
  res=$(sed -n 's/^qevict_tenant_kv_reserved_bytes{tenant="gpu-t"} \([0-9]*\).*/\1/p' <<<"$m")
  quo=$(sed -n 's/^qevict_tenant_kv_quota_bytes{tenant="gpu-t"} \([0-9]*\).*/\1/p' <<<"$m")
  if [[ -n "$res" ]]; then
    ((res > max_res)) && max_res=$res
    [[ "$quo" == "$QUOTA" ]] || bad "metrics: quota $quo, want $QUOTA"
    ((res <= QUOTA)) || bad "metrics: reserved $res above the quota $QUOTA"
  fi
  "$Q" requests --tenant gpu-t --state queued,running --json >"$T/reqs" 2>/dev/null
  sum=0
  while read -r b; do sum=$((sum + b)); done < <(grep -o '"reserved_bytes":[0-9]*' "$T/reqs" | cut -d: -f2)
  ((sum > max_sum)) && max_sum=$sum
  ((sum <= QUOTA)) || bad "qevict requests: reserved $sum above the quota $QUOTA"
  grep -q REQUEST_STATE_QUEUED "$T/reqs" && queued=1
  samples=$((samples + 1))
  sleep 0.1
done
echo "serve_gpu: ${#POLICIES[@]} requests of $N_NEW tokens done in" \
  "$((($(date +%s%N) - t_sub) / 1000000)) ms (QE_CUDA_GRAPHS=${QE_CUDA_GRAPHS:-1})"
echo "serve_gpu: $samples samples: reserved at most $max_res (metrics), $max_sum (requests)" \
  "of $QUOTA; queued seen: $queued"
((max_res > 0 && max_sum > 0)) || bad "no sample saw reserved bytes"
((queued)) || bad "no request waited for the quota (the check did not bite)"

declare -A seen
for i in "${!POLICIES[@]}"; do
  wait "${pids[$i]}" || bad "request $i (${POLICIES[$i]}) exited $?: $(cat "$T/r$i.err")"
  f="$T/r$i"
  grep -q '"finish":"length"' "$f" || bad "request $i: $(head -c 300 "$f")"
  [[ "$(num completion_tokens "$f")" == "$N_NEW" ]] || bad "request $i: not $N_NEW tokens"
  w=$(sed -n 's/.*"worker":"\([^"]*\)".*/\1/p' "$f")
  seen[$w]=1
  bytes=$(num bytes "$f") budget=$(num budget_bytes "$f")
  ((bytes > 0)) || bad "request $i (${POLICIES[$i]}): no memory figures: $(grep -o '"memory".*' "$f")"
  # (FullKV too: on a GPU its reservation counts the whole pages of 16 tokens it holds)
  ((bytes <= budget)) || bad "request $i: ${POLICIES[$i]} holds $bytes bytes over its budget $budget"
  if [[ ${POLICIES[$i]} == qevict ]]; then
    ((budget < R_FULL)) || bad "request $i: qevict budget $budget not below FullKV $R_FULL"
  fi
  echo "  request $i ${POLICIES[$i]}: worker $w, $(grep -o '"memory":{[^}]*}' "$f" | head -c 240)"
done
((${#seen[@]} == WORKERS)) || bad "requests ran on ${!seen[*]}, want $WORKERS group(s)"
if ((FITS)); then # SnapKV at windows of 8 (frozen prefill scores on the GPU cache): accepted
  sub "$T/snap" --policy snapkv --window 8 --budget 0.3 || bad "snapkv: $(cat "$T/snap.err")"
  grep -q '"finish":"length"' "$T/snap" || bad "snapkv: $(head -c 300 "$T/snap")"
  bytes=$(num bytes "$T/snap") budget=$(num budget_bytes "$T/snap")
  ((bytes > 0 && bytes <= budget)) || bad "snapkv holds $bytes bytes of its budget $budget"
  echo "  snapkv window 8: $(grep -o '"memory":{[^}]*}' "$T/snap" | head -c 240)"
fi
"$Q" requests --tenant gpu-t --limit 20 | sed 's/^/  /'

kill "$SERVE"
wait "$SERVE" || bad "qevict serve exited $? on SIGTERM"
SERVE=0
grep -qiE 'engine stopped|fatal' "$T/serve.log" && bad "a worker failed: $(grep -iE 'engine stopped|fatal' "$T/serve.log" | head -3)"
# decode steps as CUDA graphs (unless QE_CUDA_GRAPHS=0; TP groups decode eagerly): the workers'
# statistics at shutdown; the FullKV requests decode in steps of their own cache alone
if [[ -z $CPU ]]; then
  grep 'decode graphs' "$T/serve.log" | sed 's/^/  /'
  if ((!FITS)); then
    : # (FullKV on another geometry runs kv_full, which has no fixed steps: no decode graphs)
  elif [[ ${QE_CUDA_GRAPHS:-1} == 0 || $TP -gt 1 ]]; then
    grep -qE ' [1-9][0-9]* steps replayed' "$T/serve.log" &&
      bad "graphs ran with QE_CUDA_GRAPHS=0 or TP > 1"
  else
    grep -qE 'graphs: [1-9][0-9]* recorded, [1-9][0-9]* steps replayed' "$T/serve.log" ||
      bad "no worker replayed a decode graph"
  fi
fi
((fail)) && { echo "--- serve.log (tail)"; tail -40 "$T/serve.log"; }
echo "serve_gpu: $([[ $fail -eq 0 ]] && echo PASS || echo FAIL)"
exit $fail
