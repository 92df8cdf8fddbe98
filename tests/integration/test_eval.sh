#!/usr/bin/env bash
# test_eval: `qevict eval` as a user runs it, on stories260K (skipped, 77, when absent) and, when
# its GGUF is present, a short SmolLM2 slice: bad options are one stderr line and exit 2 (a
# missing model file exit 1); two runs with the same seed give identical JSON apart from the
# timings; the JSON is valid and consistent: every policy run stays within its budget, budgets
# scale with the fraction, a budget below the protected regions is a reported row error (not
# a crash), a sample FullKV fails is not compared and a task it always fails is listed as
# excluded, the aggregated accuracy is the mean over the compared runs; the teacher-forced
# shadow agrees with FullKV on every token, also for pyramidkv and snapkv (their shadow is all
# Full); the help says --device keeps the diagnostics; the markdown is written.
set -uo pipefail
QEVICT="$1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STORIES="${QE_SHARED_MODELS:-$ROOT/../shared/models}/stories260K.gguf"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

[[ -f "$STORIES" ]] || { echo "SKIP: $STORIES absent" >&2; exit 77; }

# expect_exit CODE DESCRIPTION CMD...: that exit code and exactly one stderr line.
expect_exit() {
  local want="$1" what="$2"; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  [[ $rc -eq $want ]] || bad "$what: exit $rc, want $want"
  [[ $lines -eq 1 ]] || { bad "$what: $lines stderr lines"; cat "$TMP/err" >&2; }
  echo "ok ($rc) $what: $(cat "$TMP/err")" >&2
}

E=("$QEVICT" eval --model "$STORIES" --quiet)
expect_exit 2 "no model" "$QEVICT" eval --tasks qa
expect_exit 2 "unknown task" "${E[@]}" --tasks niah,qa
expect_exit 2 "unknown policy" "${E[@]}" --policies qevict,lru
expect_exit 2 "budget above 1" "${E[@]}" --budgets 0.1,1.5
expect_exit 2 "budget not a number" "${E[@]}" --budgets x
expect_exit 2 "samples 0" "${E[@]}" --samples 0
expect_exit 2 "threads past generate's 256 (a thread each)" "${E[@]}" --threads 30000
expect_exit 2 "length beyond the context" "${E[@]}" --lengths 400,100000
expect_exit 2 "graphkv on streaming" "${E[@]}" --policies streaming+graphkv
expect_exit 2 "unknown option" "${E[@]}" --bogus 1
expect_exit 2 "a trailing comma" "${E[@]}" --tasks niah_single,
expect_exit 2 "a repeated length" "${E[@]}" --lengths 256,256
# a report path that cannot be written fails before the grid runs (it had run the whole grid
# first): within seconds, on a grid of minutes
for o in --json --markdown; do
  t0=$SECONDS
  expect_exit 1 "$o to a missing directory" "${E[@]}" --tasks qa --lengths 350 --samples 4 \
    "$o" /nonexistent/r.out
  grep -qF -- "$o: cannot write '/nonexistent/r.out'" "$TMP/err" && ((SECONDS - t0 < 20)) ||
    bad "$o /nonexistent: $(cat "$TMP/err") after $((SECONDS - t0)) s"
done
# the two reports to one destination (they overwrote or interleaved each other, exit 0)
expect_exit 2 "--json and --markdown to one file" "${E[@]}" --json "$TMP/same" --markdown "$TMP/same"
expect_exit 2 "--json and --markdown both to stdout" "${E[@]}" --json - --markdown -
# an interrupted run (~10 s of grid, SIGINT after 3) leaves an earlier report as it was: the
# reports are written beside it and renamed once complete (it had emptied it at the start)
echo old >"$TMP/keep.json"
timeout -s INT 3 "${E[@]}" --tasks niah_single,qa --lengths 350,450 --samples 4 --all-samples \
  --json "$TMP/keep.json" >/dev/null 2>&1
[[ $(cat "$TMP/keep.json") == old ]] && echo "ok an interrupted eval kept the earlier report" >&2 ||
  bad "an interrupted eval changed the earlier report: $(head -c 80 "$TMP/keep.json")"
expect_exit 2 "a repeated policy" "${E[@]}" --policies streaming,streaming
expect_exit 2 "a policy option given twice" "${E[@]}" --policies qevict:window=4:window=8
expect_exit 2 "'all' in a list" "${E[@]}" --tasks all,ppl
expect_exit 2 "missing value" "${E[@]}" --lengths
expect_exit 1 "missing model file" "$QEVICT" eval --model "$TMP/nope.gguf" --quiet
expect_exit 2 "bad policy option" "${E[@]}" --policies h2o:win=8
expect_exit 2 "bad window value" "${E[@]}" --policies h2o:window=x
expect_exit 2 "bad device" "${E[@]}" --device -1
# what the arguments rule out is refused before any run (no progress, no table): a length below
# a task's shortest prompt, ppl's scored tokens and the token before them not below the length
# (each scored token is a decode step's prediction, after a prefill of at least one token), a
# length whose new tokens pass the context (2048), a ppl text too short for the length; a policy
# spec longer than a label (cut, it equalled the next one, which was dropped as its duplicate)
: >"$TMP/empty.txt"
printf 'Once upon a time.' >"$TMP/short.txt"
K="qevict:keyframe=pos:keyframe=abs:keyframe=pos:keyframe=abs"
for t in "2|needs at least|--tasks niah_single --lengths 16" \
    "2|must be longer than the 64 tokens|--tasks ppl --lengths 64 --new 64" \
    "2|and the token before them|--tasks ppl --lengths 65 --new 64" \
    "2|exceed the model context|--tasks qa --lengths 2048 --new 64" \
    "1|is empty|--tasks ppl --lengths 64 --new 8 --ppl-text $TMP/empty.txt" \
    "1|fewer than length 300 needs|--tasks ppl --lengths 300 --ppl-text $TMP/short.txt" \
    "2|longer than 63 characters|--policies $K:window=8,$K:window=16" \
    "2|--tasks has no ppl|--tasks qa --lengths 300 --ppl-text /nonexistent"; do
  IFS='|' read -r code msg args <<<"$t"
  read -ra A <<<"$args"
  expect_exit "$code" "impossible grid: $args" "${E[@]}" --samples 1 --budgets 0.5 "${A[@]}"
  grep -qF -- "$msg" "$TMP/err" || bad "impossible grid: $args: $(cat "$TMP/err")"
  [[ ! -s "$TMP/out" ]] || bad "impossible grid: $args: wrote a table"
done
# --device without a GPU: one error line (exit 1 in a CUDA build, 2 in a CPU-only build)
"${E[@]}" --device 200 --tasks qa --lengths 300 >/dev/null 2>"$TMP/dev.err"
rc=$?
[[ ($rc -eq 1 || $rc -eq 2) && $(wc -l <"$TMP/dev.err") -eq 1 ]] || bad "eval --device 200: rc $rc"
"$QEVICT" eval --help | grep -q -- "--ablations" || bad "eval --help"
# diagnostics stay on with --device (the GPU cache has the observers): the help says so
"$QEVICT" eval --help | grep -A3 -- "--device N" | grep -q "diagnostics" || bad "eval --help: --device"

# ppl scores decode steps only: with --new 1 the one scored token is predicted after the
# prefill's routing, so policies at 30% differ from FullKV (it had been the prefill's own
# prediction, which attends the whole prompt under every policy: KL 0, top-1 1 for all)
"${E[@]}" --tasks ppl --lengths 300 --samples 1 --new 1 --policies streaming,qevict,kivi \
  --budgets 0.3 --json "$TMP/p1.json" --markdown /dev/null || bad "ppl --new 1: exit $?"
python3 - "$TMP/p1.json" <<'PY' || bad "ppl --new 1: a policy's KL is 0 (the prefill's prediction)"
import json, sys
r = [x for x in json.load(open(sys.argv[1]))["runs"] if x["policy"] != "full"]
sys.exit(0 if len(r) == 3 and all(x.get("kl", 0) > 0 for x in r) else 1)
PY

# A report path that is no regular file (a FIFO, /dev/null) is written in place: the write
# through PATH.partial and a rename had replaced it with a file (/dev/null too, as root)
[[ -c /dev/null ]] || bad "eval --markdown /dev/null: /dev/null is no longer a device"
mkfifo "$TMP/fifo"
timeout 120 cat "$TMP/fifo" >"$TMP/fifo.json" &
reader=$!
"${E[@]}" --tasks ppl --lengths 300 --samples 1 --new 2 --policies streaming --budgets 0.3 \
  --json "$TMP/fifo" || bad "eval --json FIFO: exit $?"
[[ -p "$TMP/fifo" ]] || { bad "eval --json FIFO: the FIFO was replaced by a file"; kill $reader; }
wait $reader
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/fifo.json" 2>/dev/null ||
  bad "eval --json FIFO: no JSON came through it"

# The slice: two generation tasks and perplexity; 5% is below stories' protected regions.
RUN=("${E[@]}" --tasks niah_single,qa,ppl --lengths 350,450 --samples 2 --new 12
     --policies qevict,h2o,kivi --budgets 0.05,0.3,0.6 --seed 11 --all-samples)
"${RUN[@]}" --json "$TMP/a.json" --markdown "$TMP/a.md" || bad "run a"
"${RUN[@]}" --json "$TMP/b.json" --markdown "$TMP/b.md" || bad "run b"
# a shard of the same grid (sample 1 of the first length alone) gives that sample's runs of a
"${E[@]}" --tasks niah_single,qa,ppl --lengths 350 --samples 1 --first-sample 1 --new 12 \
  --policies qevict,h2o,kivi --budgets 0.05,0.3,0.6 --seed 11 --all-samples \
  --json "$TMP/f.json" --markdown "$TMP/f.md" || bad "run f (--first-sample 1)"
expect_exit 2 "first sample -1" "${E[@]}" --first-sample -1
# tools/eval_merge.py joins shards of one length: samples 0 and 1 run apart (g, f) give the
# tables of one run over both (h); on SmolLM2 when present (stories260K solves no sample, so its
# tables hold KL alone)
if [[ -n "${QE_SMOLLM2:-}" && -f "$QE_SMOLLM2" ]]; then
  J=("$QEVICT" eval --model "$QE_SMOLLM2" --quiet --threads 2 --tasks niah_single,ppl
     --lengths 400 --new 12 --policies qevict,h2o --budgets 0.3 --seed 11 --no-diagnostics)
else
  J=("${E[@]}" --tasks niah_single,qa,ppl --lengths 350 --new 12 --policies qevict,h2o,kivi
     --budgets 0.05,0.3,0.6 --seed 11 --all-samples)
fi
"${J[@]}" --samples 1 --json "$TMP/g0.json" --markdown "$TMP/g0.md" || bad "shard 0"
"${J[@]}" --samples 1 --first-sample 1 --json "$TMP/g1.json" --markdown "$TMP/g1.md" || bad "shard 1"
"${J[@]}" --samples 2 --json "$TMP/h.json" --markdown "$TMP/h.md" || bad "both samples"
python3 "$ROOT/tools/eval_merge.py" "$TMP/g_merged.md" "$TMP/g0.json" "$TMP/g1.json" &&
  python3 "$ROOT/tools/eval_merge.py" "$TMP/h_merged.md" "$TMP/h.json" &&
  cmp -s "$TMP/g_merged.md" "$TMP/h_merged.md" || bad "eval_merge: two shards differ from one run"
grep -qE ' [0-9]\.[0-9]{4} \|' "$TMP/h_merged.md" || bad "eval_merge: no KL in the table"
# tools/eval_join.py: the same shards joined give the per-task table of the one run
python3 "$ROOT/tools/eval_join.py" "$TMP/gj" "$TMP/g0.json" "$TMP/g1.json" >/dev/null &&
  python3 "$ROOT/tools/eval_join.py" "$TMP/hj" "$TMP/h.json" >/dev/null &&
  cmp -s "$TMP/gj.md" "$TMP/hj.md" || bad "eval_join: two shards differ from one run"
grep -q '| ppl | ' "$TMP/hj.md" || bad "eval_join: no perplexity rows"
if [[ -n "${QE_SMOLLM2:-}" && -f "$QE_SMOLLM2" ]]; then
  grep -qE '\| [0-9.]+ \([1-9][0-9]*\)' "$TMP/h_merged.md" || bad "eval_merge: no accuracy compared"
fi
"${E[@]}" --tasks niah_single --lengths 300 --samples 1 --new 8 \
  --policies streaming,h2o:window=8,qevict:window=16:keyframe=window,qevict:keyframe=pos \
  --budgets 0.3 \
  --json "$TMP/c.json" --markdown "$TMP/c.md" || bad "run c (no --all-samples)"
grep -q '"label":"h2o:window=8","policy":"h2o","window":8' "$TMP/c.json" || bad "h2o:window=8 variant"
grep -q '"label":"qevict:window=16:keyframe=window","policy":"qevict","window":16' "$TMP/c.json" ||
  bad "qevict:window=16:keyframe=window variant"
grep -q '"label":"qevict:keyframe=pos","policy":"qevict"' "$TMP/c.json" || bad "qevict:keyframe=pos"
expect_exit 2 "bad policy option" "${E[@]}" --policies qevict:keyframe=diagonal
"${E[@]}" --tasks qa --lengths 400 --samples 1 --new 8 --policies qevict --budgets 0.3 \
  --ablations --no-diagnostics --all-samples --json "$TMP/d.json" --markdown "$TMP/d.md" || bad "run d (ablations)"
# the pyramid and pooled policies' shadow is all Full too (qevict's routing on their windows)
"${E[@]}" --tasks niah_single --lengths 300 --samples 1 --new 8 --policies pyramidkv,snapkv \
  --budgets 0.5 --all-samples --json "$TMP/e.json" --markdown "$TMP/e.md" || bad "run e (pyramidkv)"
grep -q "Excluded (FullKV solves no sample)" "$TMP/a.md" || bad "markdown lacks the exclusions"
grep -q "Perplexity" "$TMP/a.md" || bad "markdown lacks the perplexity table"

SMOL=""
if [[ -n "${QE_SMOLLM2:-}" && -f "$QE_SMOLLM2" ]]; then
  "$QEVICT" eval --model "$QE_SMOLLM2" --quiet --tasks niah_single --lengths 600 --samples 1 \
    --new 12 --policies qevict --budgets 0.25 --json "$TMP/s.json" \
    --markdown "$TMP/s.md" || bad "SmolLM2 slice"
  SMOL="$TMP/s.json"
fi

python3 - "$TMP/a.json" "$TMP/b.json" "$TMP/c.json" "$TMP/d.json" "$TMP/e.json" "$TMP/f.json" $SMOL <<'PY' || fail=1
import json, math, sys
a, b, c, d, e5, f6 = (json.load(open(p)) for p in sys.argv[1:7])
extra = [json.load(open(p)) for p in sys.argv[7:]]
errs = []
def check(ok, what):
    if not ok: errs.append(what)

ta, tb = a.pop("timings"), b.pop("timings")
check(a == b, "two runs with the same seed differ (apart from timings)")
check(len(ta["runs_s"]) == len(a["runs"]), "one timing per run")
shard = [r for r in a["runs"] if r["length"] == 350 and r["sample"] == 1]
check(f6["config"]["first_sample"] == 1 and f6["runs"] == shard,
      "--first-sample 1 gives sample 1's runs of the whole grid")

def consistent(d, name):
    runs = d["runs"]
    full = {(r["task"], r["length"], r["sample"]): r for r in runs if r["policy"] == "full"}
    for r in runs:
        key = (r["task"], r["length"], r["sample"])
        if r["policy"] == "full" or "error" in r: continue
        f = full[key]
        if r["task"] != "ppl":
            check(r["compared"] == bool(f.get("pass")), f"{name}: compared flag of {key} {r['policy']}")
        m = r["memory"]
        check(m["peak_bytes"] <= m["budget_bytes"] and m["bytes"] <= m["budget_bytes"],
              f"{name}: {r['policy']} over its budget")
        if "diagnostics" in r:
            dg = r["diagnostics"]
            check(dg["shadow_agreement"] == dg["forced"] == f["n_out"],
                  f"{name}: shadow disagrees with FullKV on {key}")
            check(len(dg["fmm_steps"]) == dg["forced"] + 1, f"{name}: fmm_steps length")
            check(dg["fmm"] is None or 0 <= dg["fmm"] <= 1, f"{name}: FMM out of [0, 1]")
    # budgets scale with the fraction (same prompt, same policy)
    by = {}
    for r in runs:
        if "memory" in r: by.setdefault((r["task"], r["length"], r["sample"], r["policy"]), {})[r["budget"]] = r["memory"]["budget_bytes"]
    for k, v in by.items():
        lo = min(v)
        for hi in v:
            check(abs(v[hi] / v[lo] - hi / lo) < 0.02 * hi / lo, f"{name}: budget bytes do not scale: {k} {v}")
    # exclusions and the aggregated accuracy
    gen = [t["name"] for t in d["config"]["tasks"] if t["name"] != "ppl"]
    for t in gen:
        passed = any(r.get("pass") for r in runs if r["policy"] == "full" and r["task"] == t)
        check((t in d["excluded_tasks"]) == (not passed), f"{name}: exclusion of {t}")
    for cell in d["table"]:
        if cell["task"] in ("average", "ppl") or cell["policy"] == "full" or cell["length"] is not None: continue
        sc = [r["score"] for r in runs if r["task"] == cell["task"] and r["policy"] == cell["policy"]
              and r["budget"] == cell["budget"] and r["compared"] and "error" not in r]
        want = sum(sc) / len(sc) if sc else None
        got = cell["accuracy"]
        check((got is None and want is None) or (got is not None and want is not None and abs(got - want) < 1e-5),
              f"{name}: accuracy of {cell['task']} {cell['policy']} {cell['budget']}: {got} vs {want}")
    return runs

runs = consistent(a, "a")
errors = [r for r in runs if "error" in r]
check(errors and all(r["budget"] == 0.05 and "protected regions" in r["error"] for r in errors),
      "5% budgets are row errors naming the protected regions, and only they")
check(any(r["budget"] == 0.3 and "diagnostics" in r for r in runs), "diagnostics at 30%")
ppl = [r for r in runs if r["task"] == "ppl" and "error" not in r]
check(ppl and all(r["ppl"] > 1 and r["kl"] >= 0 for r in ppl), "perplexity rows")
check(all(r["kl"] == 0 for r in ppl if r["policy"] == "full"), "FullKV's KL to itself is 0")
check(len([r for r in runs if r["policy"] == "full"]) == 3 * 2 * 2, "one FullKV run per sample")
check(len(runs) == 3 * 2 * 2 * (1 + 3 * 3), "every policy x budget on every sample (--all-samples)")

rc_ = consistent(c, "c")
failed = [r for r in rc_ if r["policy"] == "full" and not r["pass"]]
check(all(not any(x["policy"] != "full" and x["sample"] == f["sample"] for x in rc_) for f in failed),
      "without --all-samples, samples FullKV fails run no policy")

re_ = consistent(e5, "e")
check(len([r for r in re_ if "diagnostics" in r]) == 2, "pyramidkv and snapkv have diagnostics")

labels = {p["label"] for p in d["config"]["policies"]}
check({"qevict q=0.3", "qevict bits=4", "qevict window=32", "qevict promote=off", "qevict+graphkv"} <= labels,
      f"ablation variants: {sorted(labels)}")
check(all("diagnostics" not in r for r in d["runs"]), "--no-diagnostics")
check(len(d["runs"]) == 1 + len(labels), "every ablation variant ran")
for i, e in enumerate(extra):
    consistent(e, f"smollm2")

for e in errs: print("FAIL:", e, file=sys.stderr)
print(f"checked {len(a['runs'])} + {len(c['runs'])} + {len(d['runs'])} runs", file=sys.stderr)
sys.exit(1 if errs else 0)
PY
exit $fail
