#!/usr/bin/env bash
# gpu_longctx_ab.sh: one device call that checks a tree's kernels (test_model_graph, test_kv_gpu,
# test_kc_quant and attn_decode, each when packed) and times attn_decode's long_ctx shapes (--shapes
# lc_, when packed) and long_ctx at 32K, $POLS (default "full qevict"), $ROUNDS rounds (2) of $NEW
# new tokens (16), the binaries $BINS (default "long_ctx_base long_ctx": a base tree's long_ctx,
# packed beside the others in carry/pack, against the tree's). Tars its logs to $OUT/$TAG.tgz
# ($TAG: longctx_ab unless set, so that two runs in one call keep both). SANITIZE=1 first runs
# compute-sanitizer memcheck and racecheck over $SAN_RUNS (comma-separated commands of packed
# binaries; default test_kc_quant, the migration kernels, test_kv_gpu --small, routing, and
# attn_decode --small, decode attention). With attn_decode_base
# packed (a base tree's attn_decode) or attn_decode_NAME (a variant), the decode-attention kernel
# bench of each against the tree's, first.
# The pack (here): the four binaries the call runs, from the tree's CUDA build, and the base's:
#   for b in bench/long_ctx tests/kernels/{test_kv_gpu,test_model_graph,test_kc_quant,attn_decode}; do
#     strip -o carry/pack/${b##*/} build-srv-dev/$b && xz -T0 -6 carry/pack/${b##*/}; done
#   strip -o carry/pack/long_ctx_base BASE/build-srv-dev/bench/long_ctx && xz carry/pack/long_ctx_base
#   plus libs.tar.xz (bench/device_pack.sh's pack_libs); the whole of device_pack.sh's pack with a
#   base beside it is over the 64 MiB a call carries.
# LC=0 leaves out attn_decode's long_ctx shapes; ROUNDS=0 the long_ctx runs; CHECKS=0 the checks
# (with them the attn_decode long_ctx shapes).
# ROUTE_PROF=1 adds a QEvict run of the tree's long_ctx with its routing passes timed by stage.
# PROFILE=1 adds the tree's QEvict decode steps 6-8 by kernel (bench/lc_ncu_steps.sh); KQ_SRC=1
# the key quantization's Nsight Compute source profile (instruction mix and stalls).
# Usage (repo root, on the device): bash bench/gpu_longctx_ab.sh   (carry: carry/pack)
cd "$(dirname "$0")/.." || exit 2
source bench/device_unpack.sh || exit 1
TAG=${TAG:-longctx_ab}
L=$OUT/$TAG; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$L/gpu.txt"
have() { command -v "$1" >/dev/null; }
for t in test_model_graph test_kv_gpu test_kc_quant; do # (each when packed; CHECKS=0: none)
  [[ ${CHECKS:-1} == 0 ]] && break
  have $t || { echo "$t: not packed"; continue; }
  timeout 200 $t > "$L/$t.log" 2>&1; echo "$t rc $?: $(tail -1 "$L/$t.log")"
  grep -E "FAIL" "$L/$t.log" | head -3
done
if have attn_decode && [[ ${CHECKS:-1} != 0 ]]; then
  timeout 200 attn_decode > "$L/attn_check.log" 2>&1
  echo "attn_decode check rc $?: $(tail -1 "$L/attn_check.log")"
  grep -E "FAIL" "$L/attn_check.log" | head -3
  if [[ ${LC:-1} == 1 ]]; then # (LC=0: not the long_ctx shapes)
    timeout 200 attn_decode --bench --shapes lc_ > "$L/attn_lc.log" 2>&1; echo "attn_decode lc rc $?"
    tail -12 "$L/attn_lc.log"
  fi
fi
# attn_decode_NAME packed (attn_decode_base: a base tree's; any other NAME: a variant, e.g. built
# with other -D flags): the kernel bench (every shape or $ATTN_SHAPES, the automatic chunking) of
# each against the tree's, checked first, two rounds alternating ($ATTN_SHAPES: comma-separated
# name substrings, one bench run each), summarised by
# tools/attn_ab_table.py (the variant's logs first)
VARS=$(cd "$QE_DEV/bin" && ls attn_decode_* 2>/dev/null)
if [[ -n $VARS ]]; then
  for b in $VARS; do
    [[ $b == attn_decode_base ]] && continue
    timeout 200 "$b" > "$L/attn_check_$b.log" 2>&1; echo "$b check rc $?: $(tail -1 "$L/attn_check_$b.log")"
  done
  for r in 1 2; do
    for b in $VARS attn_decode; do
      : > "$L/attnab_${b}_$r.log"
      IFS=, read -ra SUBS <<< "${ATTN_SHAPES:-}"
      for sub in "${SUBS[@]:-}"; do
        timeout 200 "$b" --bench ${sub:+--shapes "$sub"} >> "$L/attnab_${b}_$r.log" 2>&1
        echo "$b bench ${sub:-all} round $r rc $?"
      done
    done
  done
  for b in $VARS; do
    echo "== $b against the tree's attn_decode"
    python3 tools/attn_ab_table.py "$L"/attnab_${b}_[0-9].log -- "$L"/attnab_attn_decode_[0-9].log
  done
fi
if [[ ${SANITIZE:-0} == 1 ]]; then
  IFS=, read -ra SAN <<< "${SAN_RUNS:-test_kc_quant,test_kv_gpu --small,attn_decode --small}"
  for t in memcheck racecheck; do
    for x in "${SAN[@]}"; do
      have "${x%% *}" || continue
      n="$L/san_${t}_$(printf %s "$x" | tr -c 'A-Za-z0-9_' _).log" # (one log a command line)
      timeout 240 compute-sanitizer --tool $t $x > "$n" 2>&1
      echo "$t $x rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$n" | tail -1)"
    done
  done
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for b in ${BINS:-long_ctx_base long_ctx}; do
    for pol in ${POLS:-full qevict}; do
      timeout 150 "$b" --policy $pol --budget 0.2 --ctx 32768 --new "${NEW:-16}" \
        > "$L/${b}_${pol}_$r.json" 2> "$L/${b}_${pol}_$r.err"
      echo "$b $pol round $r rc $?: $(tail -1 "$L/${b}_${pol}_$r.err")"
    done
  done
done
# ROUTE_PROF=1: one QEvict run of the tree's long_ctx with QE_ROUTE_PROF=1 (the decode routing
# passes timed by stage with CUDA events; the pass waits for its last event, so its step time is
# not the record's), its stage table printed
if [[ ${ROUTE_PROF:-0} == 1 ]]; then
  QE_ROUTE_PROF=1 timeout 150 long_ctx --policy qevict --budget 0.2 --ctx 32768 --new "${NEW:-16}" \
    > "$L/route_prof.json" 2> "$L/route_prof.err"
  echo "long_ctx qevict, QE_ROUTE_PROF=1, rc $?:"
  grep "route prof" "$L/route_prof.err"
fi
# FULL_ONCE=1: one FullKV run of the tree's long_ctx besides (when $POLS leaves it out)
if [[ ${FULL_ONCE:-0} == 1 ]]; then
  timeout 150 long_ctx --policy full --budget 0.2 --ctx 32768 --new "${NEW:-16}" \
    > "$L/long_ctx_full_1.json" 2> "$L/long_ctx_full_1.err"
  echo "long_ctx full rc $?: $(tail -1 "$L/long_ctx_full_1.err")"
fi
# KQ_SRC=1: the key quantization's source-level profile (its first launch, in the fill of 8
# sequences: --max-seqs leaves ncu the memory to save and restore the kernel's buffers)
if [[ ${KQ_SRC:-0} == 1 ]]; then
  timeout 240 ncu -k regex:kq_quant_keys -c 1 --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight -o "$L/kq" long_ctx --policy qevict --budget 0.2 --ctx 32768 --new 1 \
    --max-seqs 8 > "$L/kq_ncu.log" 2>&1
  echo "ncu kq rc $?: $(grep -E '==PROF==|==ERROR==' "$L/kq_ncu.log" | tail -1)"
  ncu -i "$L/kq.ncu-rep" --page details > "$L/kq_details.txt" 2>&1
  grep -E "Duration|Issue Slots Busy|Executed Ipc|Registers Per|Achieved Occupancy" "$L/kq_details.txt"
  ncu -i "$L/kq.ncu-rep" --page source --print-source sass --csv > "$L/kq_src.csv" 2>&1
  python3 tools/ncu_sass_summary.py "$L/kq_src.csv" | head -24
  rm -f "$L/kq.ncu-rep"
fi
# the tree's QEvict decode steps 6-8 (step 7 routes) by kernel
[[ ${PROFILE:-0} == 1 ]] && bash bench/lc_ncu_steps.sh qevict "$L"
python3 - "$L" <<'PY'
import json, sys, os, glob
d = sys.argv[1]
print("%-18s %-7s %5s %4s %9s %9s %9s %8s" % ("binary", "policy", "round", "seqs", "step ms", "tok/s", "route ms", "err"))
for f in sorted(glob.glob(os.path.join(d, "long_ctx*_*.json"))):
    try: j = json.loads(open(f).read().strip().splitlines()[-1])
    except Exception: print(os.path.basename(f), "unreadable"); continue
    n = os.path.basename(f)[:-5].rsplit("_", 2)
    print("%-18s %-7s %5s %4d %9.3f %9.1f %9.3f %8d" % (n[0], n[1], n[2], j["sequences"], j["step_ms"],
          j["tokens_per_s"], j.get("route_ms_per_step", -1), j["ranks"][0].get("pool_err_flags", 0)))
    if "promotions" in j: print("   migrations in the timed steps: promotions %d demotions %d quantizations %d evictions %d" % (j["promotions"], j["demotions"], j["quantizations"], j["evictions"]))
PY
tar -C "$OUT" -czf "$OUT/$TAG.tgz" "$TAG" && rm -rf "$L"
