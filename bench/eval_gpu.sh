#!/usr/bin/env bash
# eval_gpu.sh: issue 7's grid on the device's GPU (`qevict eval --device 0`), SmolLM2-135M-
# Instruct, in three device calls (the model is above one call's 64 MiB: it travels in two
# halves, carry/sm_a then carry/sm_b, kept in build-stash/ while the machine stays warm).
#   PHASE=stash      (carry carry/pack carry/sm_a) keeps the first half
#   PHASE=grid       (carry carry/pack carry/sm_b) joins the halves; every task at 1K, 2K, 4K
#                    and 7.5K tokens, 2 samples, FullKV and qevict, kivi, h2o and streaming (at
#                    windows of 8 tokens: the GPU cache routes windows), at 5/10/20/40% of
#                    FullKV's bytes; one JSON and one markdown per length into $DEST
#   PHASE=ablations  (carry carry/pack) qevict's ablations at 2K and 4K, 5% and 10%
#   PHASE=qwen_stash (carry carry/qNN, QW_PART=NN) keeps part NN of Qwen2.5-Coder-1.5B-Instruct
#                    Q4_K_M (deploy/fetch-model-qwen.sh; 1.1 GB) in parts q00..q25 of `split -b 42M
#                    -d -a 2` (a part and the tracked tree must stay under 64 MiB: 42M beside a
#                    20.6 MB tree; split -b 40M (q00..q26) once the tree passes 23 MB), each in
#                    a call of its own while the machine stays warm
#   PHASE=qwen       (carry carry/pack_g and the last part) joins the parts, checks the pinned sha256,
#                    then the grid's policies and budgets at 1K, 2K, 4K and 7.5K, $SAMPLES
#                    samples (default 2), seed 1
#   PHASE=qwen_ablations (carry carry/pack_g and the last part) the same join, then qevict's
#                    ablations at 4K, 2K and 7.5K (5% and 10%, $SAMPLES samples, seed 1)
#   PHASE=qwen_keyframe (carry carry/pack_g and the last part) the same join, then qevict with
#                    pre-RoPE against post-RoPE INT2 keys at 1K-7.5K, 5-40%, $SAMPLES samples
#   PHASE=qwen_snapkv (carry carry/pack_g and the last part) the same join, then snapkv and
#                    pyramidkv at windows of 8 beside qevict and h2o's 8: every task at 1K, 2K, 4K
#                    and 7.5K (QS_LENGTHS, longest first), 5/10/20/40%, $SAMPLES samples (default 2:
#                    the Qwen grid's) from sample $FIRST (default 0), seed 1
#   PHASE=qwen_window4 (carry carry/pack_g and the last part) the same join, then windows of 4
#                    (qevict, h2o, streaming) beside qevict's 8 and h2o's 8 at 2K, 4K and 7.5K
#                    (5%, 10%, $SAMPLES samples, default 4, seed 1), and the perplexity text at
#                    7,480 tokens (the GPL-3 text is 7,486 Qwen tokens: 7,500 does not fit) for
#                    the grid's policies at 5-40%
#   PHASE=graphkv    (carry carry/pack_g carry/sm_b) joins the halves; qevict+graphkv and
#                    h2o+graphkv (windows of 8) beside qevict and h2o, the grid's lengths,
#                    budgets, samples (6) and seed (1), so that GraphKV's effect is read off
#                    one run
#   PHASE=keyframe   (the model in three parts carry/sm_a, sm_b, sm_c of `split -n 3`, each
#                    stashed by PHASE=stash in a call of its own, or carried in this one; the
#                    pack unpacked by an earlier call or carried) qevict with pre-RoPE INT2 keys
#                    against qevict:keyframe=abs (post-RoPE), every task at 1K-7.5K, 5/10/20/40%,
#                    $SAMPLES samples (default 4), seed 1
#   PHASE=window4    (the model in parts sm_a..sm_d of `split -n 4`, stashed or carried) qevict, h2o and streaming at
#                    windows of 4 tokens beside qevict's default 8, the ablations' lengths
#                    (2K, 4K, 7.5K), budgets (5%, 10%), samples (6) and seed (1)
#   PHASE=snapkv     (the model in parts sm_a..sm_d, stashed or carried; carry/pack_g with
#                    test_kv_gpu.xz) test_kv_gpu first (SnapKV's and PyramidKV's routing on the
#                    device against kv_route_decide and the CPU cache's), then the grid with
#                    snapkv and pyramidkv at windows of 8 beside qevict, kivi, h2o and streaming:
#                    every task at 1K-7.5K, 5/10/20/40%, $SAMPLES samples (default 6), seed 1
#   PHASE=diag       (carry carry/pack carry/sm_b) joins the halves; the grid's policies at 2K
#                    and 4K, 5% and 10%, 2 samples, with the mechanism diagnostics (FMM, churn,
#                    LIR, QSA, INT2 mass ratio) from the GPU cache's observers
# Binaries from carry/pack (bench/device_pack.sh). Usage (repo root, device): PHASE=grid
# DEST=$OUT bench/eval_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [[ ${PHASE:-} != stash && ${PHASE:-} != qwen_stash ]]; then # (stash carries no pack: the pack and a half exceed a call)
  if [[ -f ${PACK:-carry/pack}/qevict.xz ]]; then
    # shellcheck source=bench/device_unpack.sh
    source bench/device_unpack.sh || exit 1
  else # unpacked by an earlier call on this machine
    export PATH="${QE_DEV:-/tmp/qe}/bin:/usr/local/cuda/bin:$PATH"
    export LD_LIBRARY_PATH="${QE_DEV:-/tmp/qe}/lib:${QE_DEV:-/tmp/qe}/libssl:/usr/local/cuda/lib64"
    command -v qevict > /dev/null || { echo "no pack carried or unpacked" >&2; exit 1; }
  fi
fi
DEST=${DEST:-bench/out/eval_gpu}
mkdir -p "$DEST" build-stash
M=build-stash/smollm2.gguf
ev() { # NAME TMO args...
  local name=$1 tmo=$2 t0=$SECONDS
  shift 2
  timeout "$tmo" qevict eval --model "$M" --device 0 --quiet --json "$DEST/$name.json" \
    --markdown "$DEST/$name.md" "$@" 2> "/tmp/$name.err"
  echo "$name rc $? in $((SECONDS - t0)) s"
  tail -2 "/tmp/$name.err"
}
join_parts() { # the model from its parts sm_a.. (split -n 3 or 4), carried here or stashed before
  local x sum
  for x in a b c d; do
    [[ -f carry/sm_$x/part ]] && cp carry/sm_$x/part build-stash/sm_$x
  done
  cat build-stash/sm_? > "$M" || return 1
  sum=$(sha256sum "$M" | awk '{print $1}')
  [[ $sum == b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ]] ||
    { echo "smollm2: sha256 $sum (parts: $(ls build-stash))"; return 1; }
}
case "${PHASE:-}" in
  stash) for x in a b c d; do
      [[ -f carry/sm_$x/part ]] && cp carry/sm_$x/part build-stash/sm_$x && echo "stashed sm_$x"
    done ;;
  window4)
    join_parts || exit 1
    for L in 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "window4_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples 6 --seed 1 \
        --no-diagnostics --budgets 0.05,0.1 \
        --policies qevict,qevict:window=4,h2o:window=4,streaming:window=4,h2o:window=8
    done ;;
  keyframe)
    join_parts || exit 1
    for L in 1024 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "keyframe_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-4}" \
        --seed 1 --no-diagnostics --budgets 0.05,0.1,0.2,0.4 --policies qevict,qevict:keyframe=abs
    done ;;
  snapkv)
    join_parts || exit 1
    timeout 200 test_kv_gpu > "$DEST/test_kv_gpu.log" 2>&1
    echo "test_kv_gpu rc $?"
    grep -E "^FAIL|snapkv|pyramidkv" "$DEST/test_kv_gpu.log" | head -12
    for L in 1024 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "snapkv_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-6}" \
        --seed 1 --budgets 0.05,0.1,0.2,0.4 --policies \
        qevict,kivi,h2o:window=8,streaming:window=8,snapkv:window=8,pyramidkv:window=8
    done ;;
  grid)
    cat build-stash/sm_a carry/sm_b/part > "$M" || exit 1
    sha256sum "$M"
    for L in 1024 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "grid_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples 2 \
        --policies qevict,kivi,h2o:window=8,streaming:window=8 --budgets 0.05,0.1,0.2,0.4
    done ;;
  diag)
    cat build-stash/sm_a carry/sm_b/part > "$M" || exit 1
    sha256sum "$M"
    for L in 2048 4096; do
      ((SECONDS < 400)) || { echo "skipped $L (time)"; continue; }
      ev "diag_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples 2 \
        --policies qevict,kivi,h2o:window=8,streaming:window=8 --budgets 0.05,0.1
    done ;;
  qwen_stash) cp "carry/q$QW_PART/part" "build-stash/qw_$QW_PART" && echo "stashed $QW_PART" ;;
  qwen | qwen_ablations | qwen_keyframe | qwen_window4 | qwen_snapkv)
    M=build-stash/qwen.gguf
    for d in carry/q[0-9][0-9]; do cp "$d/part" "build-stash/qw_${d##*/q}" || exit 1; done
    cat build-stash/qw_?? > "$M" || exit 1
    sum=$(sha256sum "$M" | awk '{print $1}')
    [[ $sum == cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ]] ||
      { echo "qwen: sha256 $sum (parts: $(ls build-stash))"; exit 1; }
    if [[ $PHASE == qwen_keyframe ]]; then
      for L in 1024 2048 4096 7500; do
        ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
        ev "qwen_kf_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-2}" \
          --seed 1 --no-diagnostics --budgets 0.05,0.1,0.2,0.4 \
          --policies "${KF_POLICIES:-qevict:keyframe=pos,qevict:keyframe=abs}" ${KF_EXTRA:-}
      done
      exit 0
    fi
    if [[ $PHASE == qwen_snapkv ]]; then
      for L in ${QS_LENGTHS:-7500 4096 2048 1024}; do
        ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
        ev "qwen_snapkv_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples \
          "${SAMPLES:-2}" --first-sample "${FIRST:-0}" --seed 1 --no-diagnostics --budgets \
          0.05,0.1,0.2,0.4 --policies qevict,h2o:window=8,snapkv:window=8,pyramidkv:window=8
      done
      exit 0
    fi
    if [[ $PHASE == qwen_window4 ]]; then
      for L in 2048 4096 7500; do
        ((SECONDS < 400)) || { echo "skipped $L (time)"; continue; }
        ev "qwen_w4_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-4}" \
          --seed 1 --no-diagnostics --budgets 0.05,0.1 ${W4_EXTRA:-} --policies \
          qevict,qevict:window=4,h2o:window=8,h2o:window=4,streaming:window=4
      done
      ((SECONDS < 470)) && ev qwen_ppl_7480 $((560 - SECONDS)) --tasks ppl --lengths 7480 \
        --samples 1 --seed 1 --budgets 0.05,0.1,0.2,0.4 \
        --policies qevict,kivi,h2o:window=8,streaming:window=8
      exit 0
    fi
    if [[ $PHASE == qwen_ablations ]]; then
      for L in 4096 2048 7500; do
        ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
        ev "qwen_abl_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-2}" \
          --seed 1 --no-diagnostics --budgets 0.05,0.1 --policies qevict --ablations
      done
      exit 0
    fi
    for L in 1024 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "qwen_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples "${SAMPLES:-2}" \
        --seed 1 --no-diagnostics --budgets 0.05,0.1,0.2,0.4 \
        --policies qevict,kivi,h2o:window=8,streaming:window=8
    done ;;
  graphkv)
    cat build-stash/sm_a carry/sm_b/part > "$M" || exit 1
    sha256sum "$M"
    for L in 1024 2048 4096 7500; do
      ((SECONDS < 470)) || { echo "skipped $L (time)"; continue; }
      ev "graphkv_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples 6 --seed 1 \
        --no-diagnostics --budgets 0.05,0.1,0.2,0.4 \
        --policies qevict,qevict+graphkv,h2o:window=8,h2o+graphkv:window=8
    done ;;
  ablations)
    [[ -f $M ]] || { echo "no $M (the machine was not kept)"; exit 1; }
    for L in 2048 4096; do
      ev "ablations_$L" $((560 - SECONDS)) --tasks all --lengths "$L" --samples 2 \
        --policies qevict --ablations --budgets 0.05,0.1
    done ;;
  *) echo "PHASE=stash|grid|diag|ablations|graphkv|keyframe|window4|qwen_stash|qwen|qwen_ablations|qwen_window4" >&2
    exit 2 ;;
esac
