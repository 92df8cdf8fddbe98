#!/usr/bin/env bash
# multi_gpu.sh: tensor parallelism over NCCL on every GPU of the device machine (issue 6), in
# one or two device calls. Binaries from carry/pack (bench/device_pack.sh; unpacked by
# bench/device_unpack.sh); NCCL_NVLS_ENABLE=0 throughout. Prints one table last.
#   PHASE=1 (default)
#     checks   test_kern_cuda, test_kv_gpu, test_kc_quant (GPU against the CPU references)
#     equal    random Llama-3.1-8B shape, B=1, prompt 64, 256 greedy steps at TP=1, 2, 4, 8 (as
#              many as there are GPUs) with the top-2 logits of every step; then TP=T
#              teacher-forced on TP=1's tokens: agreement over all 256 steps and the TP=1 logit
#              gap wherever they disagree
#     8b       B=32, prompt 256, 256 new, FullKV and QEvict 20% at each TP: TPOT, tokens/s,
#              scaling efficiency, NCCL all-reduce time per step (CUDA events), each rank's
#              GPU memory and KV pool use; TP=max FullKV again untimed (the timers' cost)
#     ttft     one 32K-token prompt at TP=1 and TP=max: time to first token
#     70b      Llama-3-70B shape at the largest TP with 4+ GPUs (and half of it for equality
#              and scaling): B=32 FullKV and QEvict 20%
#   PHASE=2
#     32k      long_ctx --tp T (T = 1, 2, max): how many 32K-token sequences fit and decode
#              tokens/s, FullKV and QEvict 20%
#     smollm2  (when carry/sm_a + carry/sm_b, or build-stash/sm_a from PHASE=1 + carry/sm_b,
#              hold its two halves) greedy GPU vs CPU, TP=2 and 3 vs TP=1 on the GPUs, and the
#              whole daemon: tests/kernels/serve_gpu.sh with two TP=2 groups
#   PHASE=graphs
#     checks   test_kern_cuda (NCCL all-reduce recorded in a graph)
#     equal    random 8B shape, B=1, prompt 64, 256 greedy steps at TP=2, FullKV and QEvict 20%,
#              graphs against --no-graphs: the same tokens and top-2 logits at every step
#     tpot     B=32, prompt 256, 256 new, FullKV and QEvict 20%: TP=2 with graphs and eager,
#              TP=1 with graphs (graphs under tensor parallelism, all-reduces recorded)
# Usage (repo root, on the device): PHASE=1 bench/multi_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-bench/out/multi_gpu}
PHASE=${PHASE:-1}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh || exit 1
NGPU=$(nvidia-smi -L | grep -c '^GPU')
TPS=(1)
for t in 2 4 8; do ((t <= NGPU)) && TPS+=("$t"); done
TMAX=${TPS[-1]}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1
echo "GPUs: $NGPU, TP sizes: ${TPS[*]}"
nvidia-smi topo -m > "$OUT/topo.log" 2>&1 && head -8 "$OUT/topo.log"

# Runs start only while the call has time left (BUDGET_S seconds since the start, default 480),
# so the table is always printed.
BUDGET_S=${BUDGET_S:-480}
time_left() { ((SECONDS < BUDGET_S)) || { echo "skipped $1 (time)"; return 1; }; }
# END_S (optional): no run outlives this many seconds since the start (its timeout is cut).
gen() { # NAME TMO args...: qevict generate --json into $OUT/NAME.json
  local name=$1 tmo=$2 t0
  shift 2
  time_left "$name" || return 0
  [[ -n ${END_S:-} ]] && ((tmo > END_S - SECONDS)) && tmo=$((END_S - SECONDS))
  t0=$(date +%s)
  timeout "$tmo" qevict generate --json --ignore-eos "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc $? in $(($(date +%s) - t0)) s"
  grep -v '^$' "$OUT/$name.err" | tail -2
}
ids_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens'])" "$1"; }

phase1() {
  mkdir -p build-stash
  [[ -f carry/sm_a/part ]] && cp carry/sm_a/part build-stash/sm_a && echo "stashed sm_a"
  echo "== checks"
  for t in test_kern_cuda test_kv_gpu test_kc_quant; do
    QE_SHARED_MODELS=$(pwd)/carry/models timeout 200 "$t" > "$OUT/$t.log" 2>&1
    echo "$t rc $?" | tee "$OUT/rc_$t"
    grep -E "^FAIL" "$OUT/$t.log" | head -5
  done
  grep -iE "argmax|pool|routing time|gemm|prefill" "$OUT/test_kern_cuda.log" "$OUT/test_kv_gpu.log" | head -12
  if [[ "$(cat "$OUT/rc_test_kern_cuda")" != "test_kern_cuda rc 0" ]]; then
    export QE_CUDA_PREFILL=ref && echo "test_kern_cuda failed: the runs use the reference prefill kernel"
  fi
  S8=(--shape llama3-8b --device 0)
  echo "== equal: llama3-8b, B=1, prompt 64, 256 steps"
  for t in "${TPS[@]}"; do gen eq_tp$t 240 "${S8[@]}" --tp "$t" --prompt-len 64 -n 256 --top2; done
  ids_of "$OUT/eq_tp1.json" > "$OUT/eq_tp1.ids"
  for t in "${TPS[@]:1}"; do
    gen eqf_tp$t 240 "${S8[@]}" --tp "$t" --prompt-len 64 -n 256 --top2 --force-ids "$OUT/eq_tp1.ids"
  done
  echo "== 8b: B=32, prompt 256, 256 new"
  for t in "${TPS[@]}"; do
    gen b32_full_tp$t 240 "${S8[@]}" --tp "$t" --batch 32 --prompt-len 256 -n 256 --time-allreduce
    gen b32_q20_tp$t 240 "${S8[@]}" --tp "$t" --batch 32 --prompt-len 256 -n 256 --time-allreduce \
      --policy qevict --budget 0.2
  done
  gen b32_full_tp${TMAX}_untimed 240 "${S8[@]}" --tp "$TMAX" --batch 32 --prompt-len 256 -n 256
  echo "== ttft: one 32K-token prompt (prefill through the GEMM path), TP=1 and TP=$TMAX"
  gen ttft32k_tp1 200 "${S8[@]}" --prompt-len 32768 -n 4
  gen ttft32k_tp$TMAX 200 "${S8[@]}" --tp "$TMAX" --prompt-len 32768 -n 4
  S70=(--shape llama3-70b --device 0)
  if ((TMAX >= 4)); then
    local h=$((TMAX / 2))
    echo "== 70b: TP=$h and TP=$TMAX"
    gen b1_70b_tp$h 300 "${S70[@]}" --tp "$h" --prompt-len 64 -n 64 --top2
    ids_of "$OUT/b1_70b_tp$h.json" > "$OUT/b1_70b.ids"
    gen b1f_70b_tp$TMAX 300 "${S70[@]}" --tp "$TMAX" --prompt-len 64 -n 64 --top2 \
      --force-ids "$OUT/b1_70b.ids"
    gen b32_70b_full_tp$h 300 "${S70[@]}" --tp "$h" --batch 32 --prompt-len 256 -n 128 --time-allreduce
  fi
  if ((TMAX >= 2)); then
    echo "== 70b: TP=$TMAX (a 70B model does not fit one H200)"
    gen b32_70b_full_tp$TMAX 300 "${S70[@]}" --tp "$TMAX" --batch 32 --prompt-len 256 -n 128 --time-allreduce
    gen b32_70b_q20_tp$TMAX 300 "${S70[@]}" --tp "$TMAX" --batch 32 --prompt-len 256 -n 128 \
      --time-allreduce --policy qevict --budget 0.2
  fi
}

smollm2_model() { # reassembles SmolLM2 from its two halves; prints its path
  local a=carry/sm_a/part b=carry/sm_b/part
  [[ -f $a ]] || a=build-stash/sm_a
  [[ -f $a && -f $b ]] || return 1
  cat "$a" "$b" > /tmp/smollm2.gguf && echo /tmp/smollm2.gguf
}

smollm2_runs() { # MODEL
  local M=$1
  sha256sum "$M" | tee "$OUT/smollm2.sha256"
  echo "== smollm2: greedy GPU vs CPU, TP 2 and 3 vs 1 on the GPUs"
  local P="The history of the printing press begins"
  gen sm_cpu 200 --model "$M" --prompt "$P" -n 256 --top2 --threads 32
  gen sm_tp1 120 --model "$M" --prompt "$P" -n 256 --top2 --device 0
  for t in 2 3; do ((t <= NGPU)) && gen sm_tp$t 120 --model "$M" --prompt "$P" -n 256 --top2 --device 0 --tp $t; done
  ids_of "$OUT/sm_tp1.json" > "$OUT/sm_tp1.ids"
  for t in 2 3; do
    ((t <= NGPU)) && gen smf_tp$t 120 --model "$M" --prompt "$P" -n 256 --top2 --device 0 --tp $t \
      --force-ids "$OUT/sm_tp1.ids"
  done
  gen smf_cpu 200 --model "$M" --prompt "$P" -n 256 --top2 --threads 32 --force-ids "$OUT/sm_tp1.ids"
  echo "== daemon: two TP=2 groups on SmolLM2 (tests/kernels/serve_gpu.sh)"
  local tp=2
  ((NGPU >= 4)) || tp=1
  time_left serve_gpu || return 0
  SERVE_GPU_TP=$tp timeout 300 tests/kernels/serve_gpu.sh "$M" "$(command -v qevict)" \
    > "$OUT/serve_gpu.log" 2>&1
  echo "serve_gpu rc $?"
  grep -E "serve_gpu:|FAIL|worker .*connected|request [0-9]" "$OUT/serve_gpu.log" | head -30
}

phase2() {
  local M
  if M=$(smollm2_model); then smollm2_runs "$M"; else echo "smollm2: halves missing (skipped)"; fi
  echo "== 32k: long_ctx --tp T, 32K-token sequences, FullKV vs QEvict 20%"
  for t in 1 2 "$TMAX"; do
    ((t > NGPU)) && continue
    [[ -f "$OUT/long_full_tp$t.json" ]] && continue
    for pol in full qevict; do
      time_left "long_ctx tp $t $pol" || continue
      timeout 200 long_ctx --tp "$t" --policy $pol --budget 0.2 --ctx 32768 --new 16 \
        > "$OUT/long_${pol}_tp$t.json" 2> "$OUT/long_${pol}_tp$t.err"
      echo "long_ctx tp $t $pol rc $?"; tail -1 "$OUT/long_${pol}_tp$t.err"
    done
  done
}

# PHASE=tp4: the short run for a four-GPU machine when little device time is left: equality
# at TP=4 (forced on TP=1), B=32 at TP=4 (FullKV, QEvict 20%), the 70B shape at TP=4.
phase_tp4() {
  local S8=(--shape llama3-8b --device 0)
  gen eq_tp1 120 "${S8[@]}" --prompt-len 64 -n 256 --top2
  ids_of "$OUT/eq_tp1.json" > "$OUT/eq_tp1.ids"
  gen eqf_tp4 120 "${S8[@]}" --tp 4 --prompt-len 64 -n 256 --top2 --force-ids "$OUT/eq_tp1.ids"
  gen b32_full_tp4 120 "${S8[@]}" --tp 4 --batch 32 --prompt-len 256 -n 256 --time-allreduce
  gen b32_q20_tp4 120 "${S8[@]}" --tp 4 --batch 32 --prompt-len 256 -n 256 --time-allreduce \
    --policy qevict --budget 0.2
  gen b32_70b_full_tp4 200 --shape llama3-70b --device 0 --tp 4 --batch 32 --prompt-len 256 \
    -n 128 --time-allreduce
}

# PHASE=graphs: CUDA graphs under tensor parallelism (NCCL all-reduces inside the recording).
phase_graphs() {
  QE_SHARED_MODELS=$(pwd)/carry/models timeout 200 test_kern_cuda > "$OUT/test_kern_cuda.log" 2>&1
  echo "test_kern_cuda rc $?"
  grep -E "^FAIL|nccl" "$OUT/test_kern_cuda.log" | head -5
  local S8=(--shape llama3-8b --device 0) t=$TMAX q=(--policy qevict --budget 0.2) g
  local E=(--prompt-len 64 -n 256 --top2) B=(--batch 32 --prompt-len 256 -n 256)
  for g in g e; do # graphs, then eager (--no-graphs); in order of importance (BUDGET_S)
    local ng=()
    [[ $g == e ]] && ng=(--no-graphs)
    gen ${g}eq_full_tp$t 90 "${S8[@]}" --tp $t "${E[@]}" "${ng[@]}"
    gen ${g}b32_full_tp$t 90 "${S8[@]}" --tp $t "${B[@]}" "${ng[@]}"
    gen ${g}b32_q20_tp$t 90 "${S8[@]}" --tp $t "${B[@]}" "${q[@]}" "${ng[@]}"
  done
  for g in g e; do
    local ng=()
    [[ $g == e ]] && ng=(--no-graphs)
    gen ${g}eq_q20_tp$t 90 "${S8[@]}" --tp $t "${E[@]}" "${q[@]}" "${ng[@]}"
  done
  gen gb32_full_tp1 90 "${S8[@]}" "${B[@]}"
  gen gb32_q20_tp1 90 "${S8[@]}" "${B[@]}" "${q[@]}"
  python3 bench/multi_gpu_graphs.py "$OUT" "$t"
}

[[ $PHASE == graphs ]] && { phase_graphs; exit 0; }
[[ $PHASE == 1 ]] && phase1
[[ $PHASE == tp4 ]] && phase_tp4
[[ $PHASE == 2 ]] && phase2
echo "== summary"
python3 bench/multi_gpu_report.py "$OUT"
