#!/usr/bin/env bash
# test_bench_latency: `qevict bench latency` on stories260K: its JSON has a row per policy with
# positive speeds, FullKV's row holds every token (KV bytes = FullKV's) and reproduces itself,
# the tiered rows hold at most their budget, and each row's "same tokens" equals the agreement
# of separate `qevict generate` runs computed here; the table prints; --shape runs without a
# tokenizer; a policy generate refuses fails naming it (exit 1); bad usage exits 2.
set -uo pipefail
QEVICT="$1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STORIES="${QE_SHARED_MODELS:-$ROOT/../shared/models}/stories260K.gguf"
[[ -f "$STORIES" ]] || { echo "SKIP: $STORIES absent" >&2; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
P="Once upon a time there was a little girl who liked to play in the park with her friends every day"

"$QEVICT" bench latency --model "$STORIES" --prompt "$P" -n 64 --rounds 2 \
  --policies full,qevict:0.5,h2o:0.5 --json >"$TMP/b.json" 2>"$TMP/err" || bad "bench latency: $(tail -1 "$TMP/err")"
for pol in full qevict h2o; do
  budget=(); [[ $pol == full ]] || budget=(--budget 0.5)
  "$QEVICT" generate --model "$STORIES" --prompt "$P" -n 64 --ignore-eos --json --policy "$pol" \
    "${budget[@]}" >"$TMP/g_$pol.json" || bad "generate $pol"
done
python3 - "$TMP" <<'PY' || bad "the bench's report"
import json, sys
t = sys.argv[1]
b = json.load(open(t + "/b.json"))
g = {p: json.load(open("%s/g_%s.json" % (t, p)))["tokens"] for p in ("full", "qevict", "h2o")}
rows = {r["policy"]: r for r in b["policies"]}
assert b["rounds"] == 2 and b["new_tokens"] == 64 and list(rows) == ["full", "qevict", "h2o"], b
for name, r in rows.items():
    assert r["tokens"] == 64 and r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0, r
    assert r["tpot_ms"] > 0 and r["peak_rss_bytes"] > 0, r
    agree = next((i for i, (x, y) in enumerate(zip(g[name], g["full"])) if x != y), 64)
    assert r["same_tokens"] == agree, (name, r["same_tokens"], agree)
f = rows["full"]
assert f["budget"] is None and f["kv_bytes"] == f["fullkv_bytes"] > 0, f
for name in ("qevict", "h2o"):
    r = rows[name]
    assert r["budget"] == "0.5" and r["fullkv_bytes"] == f["fullkv_bytes"], r
    assert 0 < r["kv_bytes"] <= 0.5 * r["fullkv_bytes"], r
print("ok bench latency: 3 policies, same tokens %s, KV %s of FullKV" % (
    [r["same_tokens"] for r in b["policies"]],
    [round(r["kv_bytes"] / r["fullkv_bytes"], 3) for r in b["policies"]]), file=sys.stderr)
PY

"$QEVICT" bench latency --model "$STORIES" --prompt "$P" -n 64 --rounds 1 --policies full,qevict:0.6 \
  >"$TMP/t.txt" 2>/dev/null
grep -q "^full " "$TMP/t.txt" && grep -q "^qevict:0.6 " "$TMP/t.txt" && grep -q "same tokens" "$TMP/t.txt" \
  || bad "the table: $(cat "$TMP/t.txt")"
"$QEVICT" bench latency --shape tiny --prompt-len 200 -n 8 --rounds 1 --policies full,qevict:0.8 \
  --json >"$TMP/s.json" 2>"$TMP/err" && python3 -c "
import json, sys; b = json.load(open('$TMP/s.json')); assert len(b['policies']) == 2, b" \
  || bad "--shape tiny: $(tail -1 "$TMP/err")"
# the default synthetic prompt past stories260K's context: the error says it is the synthetic one
"$QEVICT" bench latency --model "$STORIES" -n 4 --rounds 1 --policies full >/dev/null 2>"$TMP/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "synthetic prompt of --input-words" "$TMP/err" \
  && echo "ok the default synthetic prompt past the context says so" >&2 \
  || bad "the synthetic prompt past the context: exit $rc, $(cat "$TMP/err")"
# -n past the context: the report gives the tokens the runs made, and what was asked (it gave
# the asked count as the new tokens)
"$QEVICT" bench latency --model "$STORIES" --prompt "$P" -n 5000 --ignore-eos --rounds 1 \
  --policies full --json >"$TMP/c.json" 2>/dev/null && python3 -c "
import json; b = json.load(open('$TMP/c.json')); r = b['policies'][0]
assert b['new_tokens_asked'] == 5000 and b['new_tokens'] == r['tokens'] < 5000, b" \
  && echo "ok bench latency -n past the context reports the tokens made" >&2 \
  || bad "-n past the context: $(head -c 300 "$TMP/c.json")"

# --prompt-file - (standard input) is read once, for every run: each run has the whole prompt
# (the first run had read it all and the next ones an empty prompt, which generate refused)
printf '%s' "$P" | "$QEVICT" bench latency --model "$STORIES" --prompt-file - -n 64 --rounds 2 \
  --policies full,qevict:0.5 --json >"$TMP/in.json" 2>"$TMP/err" && python3 -c "
import json; b, a = json.load(open('$TMP/in.json')), json.load(open('$TMP/b.json'))
assert len(b['policies']) == 2 and b['prompt_tokens'] == a['prompt_tokens'] > 1, (b, a)" \
  && echo "ok --prompt-file - in every run" >&2 || bad "--prompt-file -: $(tail -1 "$TMP/err")"
# any --prompt-file is read once: a named FIFO gives its prompt to every run (each run re-opened
# it, and the second one waited for a writer that never came)
mkfifo "$TMP/fifo"
printf '%s' "$P" >"$TMP/fifo" &
writer=$!
timeout 120 "$QEVICT" bench latency --model "$STORIES" --prompt-file "$TMP/fifo" -n 64 \
  --rounds 2 --policies full,qevict:0.5 --json >"$TMP/fifo.json" 2>"$TMP/err" && python3 -c "
import json; b, a = json.load(open('$TMP/fifo.json')), json.load(open('$TMP/b.json'))
assert len(b['policies']) == 2 and b['prompt_tokens'] == a['prompt_tokens'] > 1, (b, a)" \
  && echo "ok --prompt-file FIFO in every run" >&2 || bad "--prompt-file FIFO: $(tail -1 "$TMP/err")"
kill "$writer" 2>/dev/null; wait "$writer" 2>/dev/null
# a file's prompt past the context: the message names the file (each run reads a copy, '-')
python3 -c "print('Once upon a time ' * 700)" >"$TMP/long.txt"
"$QEVICT" bench latency --model "$STORIES" --prompt-file="$TMP/long.txt" -n 4 --rounds 1 \
  --policies full >/dev/null 2>"$TMP/err"
rc=$?
[[ $rc -eq 1 ]] && grep -qF -- "(the prompt of --prompt-file '$TMP/long.txt'" "$TMP/err" \
  && echo "ok a prompt file past the context: $(cat "$TMP/err")" >&2 \
  || bad "a prompt file past the context: exit $rc, $(cat "$TMP/err")"
# ... and no further than 64 MiB less 64 KiB (a run's generate had read 1 GiB of it)
"$QEVICT" bench latency --model "$STORIES" --prompt-file - -n 4 --rounds 1 --policies full \
  </dev/zero >/dev/null 2>"$TMP/err"
rc=$?
want="--prompt-file '-': larger than 67043328 bytes (63.9 MiB), the most bench latency reads"
[[ $rc -eq 1 ]] && grep -qF -- "$want of a prompt file" "$TMP/err" \
  && echo "ok --prompt-file - from /dev/zero: $(cat "$TMP/err")" >&2 \
  || bad "--prompt-file - from /dev/zero: exit $rc, $(cat "$TMP/err")"

# failures and usage
"$QEVICT" bench latency --model "$STORIES" --prompt "$P" -n 4 --rounds 1 --policies full,lru \
  >/dev/null 2>"$TMP/err"
rc=$?
# (refused before any run since 2026-12-06: a usage error naming the list)
[[ $rc -eq 2 ]] && grep -q "bad --policies 'full,lru'" "$TMP/err" ||
  bad "an unknown policy: exit $rc, $(cat "$TMP/err")"
usage() {
  local what="$1"; shift
  "$QEVICT" "$@" >/dev/null 2>"$TMP/err"
  local rc=$?
  [[ $rc -eq 2 ]] || bad "$what: exit $rc"
  echo "ok ($rc) $what: $(head -1 "$TMP/err")" >&2
}
usage "bench alone" bench
usage "an unknown benchmark" bench nosuch
usage "--rounds 0" bench latency --model "$STORIES" --rounds 0
usage "--rounds +2" bench latency --model "$STORIES" --rounds +2
grep -qF "bad value '+2' for --rounds" "$TMP/err" || bad "--rounds +2: $(cat "$TMP/err")"
usage "--no-graphs without --device (generate's usage error)" bench latency --model "$STORIES" \
  --prompt hi -n 4 --rounds 1 --policies full --no-graphs
grep -q -- "--no-graphs turns CUDA graphs off: it needs --device" "$TMP/err" ||
  bad "--no-graphs without --device: $(cat "$TMP/err")"
# an option conflict is reported before any input is read: standard input that never ends
# (a FIFO held open here) was read to its end first
mkfifo "$TMP/open"
exec 3<>"$TMP/open"
timeout 20 "$QEVICT" bench latency --model "$STORIES" --prompt hi --prompt-file - \
  <"$TMP/open" >/dev/null 2>"$TMP/err"
rc=$?
exec 3>&-
[[ $rc -eq 2 ]] && grep -q "give exactly one of --prompt and --prompt-file" "$TMP/err" \
  && echo "ok ($rc) --prompt with --prompt-file -, before reading: $(cat "$TMP/err")" >&2 \
  || bad "--prompt with --prompt-file - on an endless input: exit $rc, $(cat "$TMP/err")"
usage "--policy instead of --policies" bench latency --model "$STORIES" --policy qevict
usage "--input-words with --prompt (it had been ignored)" bench latency --model "$STORIES" \
  --prompt hi --input-words 5 --policies full
grep -q -- "--input-words makes the prompt" "$TMP/err" || bad "--input-words: $(cat "$TMP/err")"
usage "an empty policy" bench latency --model "$STORIES" --policies full,,qevict
usage "a budget-less colon" bench latency --model "$STORIES" --policies qevict:
usage "a bad budget, before any run" bench latency --model "$STORIES" --policies full,qevict:abc
usage "a repeated policy" bench latency --model "$STORIES" --policies full,qevict:0.2,qevict:0.2
usage "no model" bench latency --prompt hi
usage "-n without a value" bench latency --model "$STORIES" -n
usage "-n 1 (no decode step to time)" bench latency --model "$STORIES" -n 1
usage "a generate option without its value (generate's usage error)" bench latency \
  --model "$STORIES" --rounds 1 --policies full --threads
grep -q "missing value: --threads" "$TMP/err" ||
  bad "--threads without its value: $(tail -1 "$TMP/err") (it had named bench's next argument)"
"$QEVICT" bench latency --model="$STORIES" --input-words=40 -n 4 --rounds=1 --policies=full \
  --threads=1 --json >"$TMP/eq.json" 2>"$TMP/err" && python3 -c "
import json; assert json.load(open('$TMP/eq.json'))['policies'][0]['tokens'] == 4" \
  || bad "--flag=value forms: $(tail -1 "$TMP/err")"
# a value of generate's option is that option's, whatever it looks like: --prompt --json gives
# the prompt "--json" as --prompt=--json does (bench took --json for its own, and generate's
# --prompt, last, had no value: exit 2), --trace --json writes the trace to the file "--json"
# (the table printed as JSON), --seed --rounds is generate's bad seed (bench took --rounds 1);
# --graphkv=K,M,T goes to generate as one argument (it was split into two, exit 2)
for form in "--prompt --json" "--prompt=--json"; do
  "$QEVICT" bench latency --model "$STORIES" $form -n 4 --rounds 1 --policies full --json \
    >"$TMP/v.json" 2>"$TMP/err" && python3 -c "
import json; assert json.load(open('$TMP/v.json'))['prompt_tokens'] == 7" \
    && echo "ok $form: the prompt \"--json\"" >&2 || bad "$form: $(tail -1 "$TMP/err")"
done
(q=$(readlink -f "$QEVICT") && cd "$TMP" && "$q" bench latency --model "$STORIES" \
  --input-words 300 -n 4 --rounds 1 --policies qevict:0.5 --trace --json >"$TMP/v.txt" \
  2>"$TMP/err") && grep -q "same tokens" "$TMP/v.txt" && grep -q '"layer":0' "$TMP/--json" \
  && echo "ok --trace --json: a trace" >&2 \
  || bad "--trace --json: $(tail -1 "$TMP/err")"
usage "--seed --rounds: generate's bad value" bench latency --model "$STORIES" --seed --rounds 1 \
  --policies full
grep -qF "bad value '--rounds' for --seed" "$TMP/err" || bad "--seed --rounds: $(cat "$TMP/err")"
"$QEVICT" bench latency --model "$STORIES" --input-words 300 -n 4 --rounds 1 --json \
  --policies qevict:0.5 --graphkv=0.3,8,1 >/dev/null 2>"$TMP/err" || bad "--graphkv=0.3,8,1: \
$(tail -1 "$TMP/err")"
"$QEVICT" bench latency --model "$STORIES" --input-words 30000 -n 4 --rounds 1 --policies full \
  >/dev/null 2>"$TMP/err"
rc=$?
# (past the most bytes a prompt within the context can take, too: generate reads no more of it)
[[ $rc -eq 1 ]] && grep -q "larger than 18432 bytes.*synthetic prompt of --input-words" "$TMP/err" \
  || bad "a synthetic prompt past the context (past an argument's 128 KiB): exit $rc, $(cat "$TMP/err")"
# a prompt of 2,047 tokens leaves the 2,048-token context room for one new token: no decode step
# to time, an error (it printed NaN speeds and exit 0)
python3 -c "print('Once upon a time ' * 511 + 'Once upon', end='')" >"$TMP/full.txt"
"$QEVICT" bench latency --model "$STORIES" --prompt-file "$TMP/full.txt" -n 8 --rounds 1 --json \
  >"$TMP/nan.json" 2>"$TMP/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "no decode step to time" "$TMP/err" && ! grep -qi nan "$TMP/nan.json" \
  || bad "no decode step: exit $rc, $(cat "$TMP/err")"
exit $fail
