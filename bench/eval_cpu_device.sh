#!/usr/bin/env bash
# eval_cpu_device.sh: the token-level baselines (snapkv, pyramidkv, and h2o and streaming per
# token) at 7.5K on the device machine's CPU cores (the GPU cache routes windows, so they run
# on the CPU backend only), SmolLM2-135M-Instruct, as shards of one grid (`qevict eval
# --first-sample`), each its own process with 2 threads, in parallel; optionally beside a GPU
# phase of bench/multi_gpu.sh on the first 4 cores. Two device calls while the machine stays
# warm (the model travels in two halves, as in bench/eval_gpu.sh):
#   PHASE=stash  (carry carry/sm_a carry/pack_cpu) keeps the first half and unpacks the CPU
#                build (bench/device_pack.sh --cpu: OpenBLAS, x86-64-v3) into build-stash/
#   PHASE=run    (carry carry/sm_b, and carry/pack_g for GPU_PHASE) joins the halves; shards:
#                $SHARDS (TASK:SAMPLE:POLICY ...; default niah_single samples 1-3 x each
#                token-level policy, and ppl x snapkv and pyramidkv) at 7,500 tokens, seed 1
#                (the GPU grid's seed: the same prompts); every shard runs FullKV first, then
#                its policy at 5% and 10% (no diagnostics). GPU_PHASE=graphs also runs
#                `PHASE=graphs bench/multi_gpu.sh` on cores 0-3 meanwhile. Shards still running
#                at DEADLINE_S (default 560) seconds are stopped and reported missing.
# Results: $DEST/shard_*.json, joined by tools/eval_join.py into $DEST/joined.{json,md}.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DEST=${DEST:-bench/out/eval_cpu_device}
S=build-stash
mkdir -p "$DEST" "$S"
case "${PHASE:-}" in
  stash)
    cp carry/sm_a/part $S/sm_a || exit 1
    (PACK=carry/pack_cpu QE_DEV=$S/qe-cpu source bench/device_unpack.sh) && echo "stashed"
    exit 0 ;;
  run) ;;
  *) echo "eval_cpu_device: PHASE=stash or PHASE=run" >&2; exit 2 ;;
esac
M=$S/smollm2.gguf
cat $S/sm_a carry/sm_b/part > "$M" || exit 1
sha256sum "$M"
NCPU=$(nproc)
nproc; grep -m1 "model name" /proc/cpuinfo
DEADLINE_S=${DEADLINE_S:-560}
FIRST=0
[[ -n ${GPU_PHASE:-} ]] && FIRST=4
shard() { # NAME CORE0 args...
  local name=$1 c0=$2
  shift 2
  (LD_LIBRARY_PATH=$S/qe-cpu/lib timeout $((DEADLINE_S - SECONDS)) taskset -c "$c0-$((c0 + 1))" \
    $S/qe-cpu/bin/qevict eval --model "$M" --threads 2 --quiet --lengths 7500 --seed 1 \
    --budgets 0.05,0.1 --no-diagnostics --json "$DEST/shard_$name.json" \
    --markdown "$DEST/shard_$name.md" "$@" 2> "$DEST/shard_$name.err"
   echo "shard $name rc $? at $SECONDS s") &
}
# The shards: TASK:SAMPLE:POLICY (SHARDS overrides; default: niah_single samples 1-3 x the
# token-level policies, and the perplexity text x snapkv and pyramidkv).
DEFAULT=""
for s in 1 2 3; do for p in snapkv pyramidkv h2o streaming; do DEFAULT+=" niah_single:$s:$p"; done; done
DEFAULT+=" ppl:0:snapkv ppl:0:pyramidkv"
core=$FIRST
for sh in ${SHARDS:-$DEFAULT}; do
  IFS=: read -r task s p <<< "$sh"
  ((core + 2 <= NCPU)) || { echo "no core left for $sh"; continue; }
  shard "${task}_s${s}_$p" $core --tasks "$task" --samples 1 --first-sample "$s" --policies "$p"
  core=$((core + 2))
done
if [[ -n ${GPU_PHASE:-} ]]; then
  PACK=carry/pack_g PHASE=$GPU_PHASE BUDGET_S=$((DEADLINE_S - 60 - SECONDS)) \
    END_S=$((DEADLINE_S - SECONDS)) OUT=$DEST/gpu \
    taskset -c 0-3 bench/multi_gpu.sh > "$DEST/gpu.log" 2>&1
  echo "gpu phase rc $? at $SECONDS s"
fi
wait
python3 tools/eval_join.py "$DEST/joined" "$DEST"/shard_*.json
# one archive of the shards' files (a call returns a limited number of files)
tar -C "$DEST" -czf "$DEST/shards.tar.gz" $(cd "$DEST" && ls shard_* gpu 2>/dev/null) &&
  rm -rf "$DEST"/shard_* "$DEST/gpu"
