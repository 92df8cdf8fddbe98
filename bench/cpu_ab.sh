#!/usr/bin/env bash
# cpu_ab: the quick start's long-context job on the CPU (SmolLM2-135M-Instruct, packed weights,
# the 2,776-token report of tests/data/towns_2k.txt with --chat, greedy, N new tokens with
# --ignore-eos), FullKV and QEvict 20%, by this tree's build/cli/qevict (rebuilt first) and by
# the same job built from another revision (BASE, default HEAD~1; built once, CPU only, with
# build/'s native and blas options, into $CACHE/ab-<commit>-<host>), alternating in one run.
# Prints each side's median prefill seconds and decode
# tokens/s, the ratios new / base, and whether both sides gave the same tokens.
# Usage: BASE=<rev> ROUNDS=3 bench/cpu_ab.sh [N_NEW_TOKENS] (default 64)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-64}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
BASE=$(git rev-parse --verify "${BASE:-HEAD~1}^{commit}")
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
MODEL=$(deploy/fetch-model.sh)
[[ -f build/build.ninja ]] || { echo "cpu_ab: run deploy/build.sh first" >&2; exit 1; }
ninja -C build cli/qevict >/dev/null
opt() { # the value of build/'s meson option $1
  meson introspect build --buildoptions |
    python3 -c "import json, sys
v = [o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'][0]
print(str(v).lower() if isinstance(v, bool) else v)"
}
SRC=$CACHE/ab-$BASE-$(hostname)
if [[ ! -x $SRC/bld/cli/qevict ]]; then
  git worktree remove --force "$SRC" 2>/dev/null || rm -rf "$SRC"
  mkdir -p "$CACHE"
  git worktree add -f --detach "$SRC" "$BASE" >/dev/null
  meson setup "$SRC/bld" "$SRC" -Dcuda=disabled -Dserving=disabled -Dnative="$(opt native)" \
    -Dblas="$(opt blas)" >/dev/null
  ninja -C "$SRC/bld" cli/qevict >/dev/null
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() { # round, side, binary, cache name, policy options
  local r=$1 side=$2 bin=$3 name=$4
  shift 4
  "$bin" generate --model "$MODEL" --prompt-file tests/data/towns_2k.txt --chat -n "$N" \
    --ignore-eos --threads "$THREADS" --cpu-weights packed "$@" --json \
    >"$OUT/${side}_${name}_$r.json"
}
for r in $(seq "$ROUNDS"); do
  for side in base new; do
    bin=build/cli/qevict
    [[ $side == base ]] && bin=$SRC/bld/cli/qevict
    run "$r" "$side" "$bin" full --policy full
    run "$r" "$side" "$bin" qevict20 --policy qevict --budget 0.2
  done
done
python3 - "$OUT" "$BASE" "$THREADS" <<'PY'
import glob, json, os, statistics, sys
out, base, threads = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    side, name, _ = os.path.basename(p)[:-5].split("_")
    runs.setdefault((name, side), []).append(json.load(open(p)))
print(f"base {base[:10]}, {threads} threads; medians of {len(runs[('full', 'new')])} rounds")
print("| cache | prefill s, base | prefill s, new | new / base | decode tok/s, base |"
      " decode tok/s, new | new / base | same tokens |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name in ("full", "qevict20"):
    b, n = runs[(name, "base")], runs[(name, "new")]
    pre = lambda rs: statistics.median(r["summary"]["prefill_s"] for r in rs)
    dsteps = lambda s: s.get("decode_steps", s["generated_tokens"] - 1)  # decode-only steps
    dec = lambda rs: statistics.median(dsteps(r["summary"]) / r["summary"]["decode_s"] for r in rs)
    pb, pn, db, dn = pre(b), pre(n), dec(b), dec(n)
    same = len({json.dumps(r["tokens"]) for r in b + n}) == 1
    print(f"| {name} | {pb:.2f} | {pn:.2f} | {pn / pb:.3f} | {db:.1f} | {dn:.1f} |"
          f" {dn / db:.3f} | {'yes' if same else 'NO'} |")
PY
