#!/usr/bin/env bash
# test_cli: the qevict command as a user runs it: bad input gives one clear error line and a
# non-zero exit (never a crash); --tp 2 and --tp 3 give the same greedy tokens as --tp 1 on
# stories260K and SmolLM2; --json is valid JSON; inspect prints the hyperparameters.
set -uo pipefail
QEVICT="$1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STORIES="${QE_SHARED_MODELS:-$ROOT/../shared/models}/stories260K.gguf"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
tokens() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d['tokens'])"; }

# expect_error DESCRIPTION CMD...: non-zero exit (not a signal), exactly one stderr line.
expect_error() {
  local what="$1"; shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -eq 0 || $rc -ge 128 ]]; then bad "$what: exit $rc"; fi
  if [[ $lines -ne 1 ]]; then bad "$what: $lines stderr lines"; cat "$TMP/err" >&2; fi
  echo "ok ($rc) $what: $(cat "$TMP/err")" >&2
}

# expect_usage DESCRIPTION NEEDLE CMD...: exit 2, one stderr line that contains NEEDLE.
expect_usage() {
  local what="$1" needle="$2"; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  [[ $rc -eq 2 && $lines -eq 1 ]] && grep -qF -- "$needle" "$TMP/err" ||
    bad "$what: exit $rc, $lines stderr lines, wanted '$needle': $(cat "$TMP/err")"
  echo "ok ($rc) $what: $(head -1 "$TMP/err")" >&2
}

[[ -f "$STORIES" ]] || { echo "SKIP: $STORIES absent" >&2; exit 77; }
python3 "$ROOT/tests/integration/make_bad_ggufs.py" "$TMP/bad" "$STORIES"
for f in "$TMP"/bad/*.gguf; do
  expect_error "inspect $(basename "$f")" "$QEVICT" inspect "$f"
  expect_error "generate $(basename "$f")" "$QEVICT" generate --model "$f" --prompt hi -n 2
done
for f in nan_eps inf_eps negative_eps; do # a bad epsilon is refused naming its key
  "$QEVICT" generate --model "$TMP/bad/$f.gguf" --prompt hi -n 2 >/dev/null 2>"$TMP/err"
  grep -q "llama.attention.layer_norm_rms_epsilon" "$TMP/err" || bad "$f.gguf: key not named"
done
expect_error "missing file" "$QEVICT" generate --model "$TMP/nope.gguf" --prompt hi
# an option conflict is reported before any input is read (standard input that never ends: a
# FIFO held open here; bench latency read all of it first: test_bench_latency)
mkfifo "$TMP/open"
exec 3<>"$TMP/open"
expect_error "--prompt with --prompt-file - on an endless input" timeout 20 "$QEVICT" generate \
  --model "$STORIES" --prompt hi --prompt-file - <"$TMP/open"
exec 3>&-
python3 -c "print('Once upon a time ' * 700)" >"$TMP/long.txt"
expect_error "prompt longer than context" "$QEVICT" generate --model "$STORIES" --prompt-file "$TMP/long.txt"
printf 'Once upon\0 a time' >"$TMP/nul.txt"
expect_error "a NUL byte in the prompt file" "$QEVICT" generate --model "$STORIES" --prompt-file "$TMP/nul.txt"
grep -q "NUL byte at offset 9" "$TMP/err" || bad "NUL prompt file: $(cat "$TMP/err")"
expect_error "prompt file is a directory" "$QEVICT" generate --model "$STORIES" --prompt-file "$TMP"
grep -q "Is a directory" "$TMP/err" || bad "directory prompt file: $(cat "$TMP/err")"
# a prompt file is read no further than the most a prompt within the context can take:
# stories260K's 2,048 tokens of at most 9 bytes (its longest piece), 18,432 bytes (/dev/zero was
# read for 1 GiB first; a file past the bound was read whole and tokenized)
BOUND="larger than 18432 bytes (18.0 KiB), the most a prompt within the model's context can take"
expect_error "prompt file /dev/zero" "$QEVICT" generate --model "$STORIES" --prompt-file /dev/zero
grep -qF -- "--prompt-file '/dev/zero': $BOUND" "$TMP/err" || bad "/dev/zero: $(cat "$TMP/err")"
python3 -c "print('a' * 18433, end='')" >"$TMP/a18433.txt"
expect_error "prompt file a byte past the bound" "$QEVICT" generate --model "$STORIES" \
  --prompt-file "$TMP/a18433.txt"
grep -qF -- "--prompt-file '$TMP/a18433.txt': $BOUND" "$TMP/err" ||
  bad "18,433 bytes: $(cat "$TMP/err")"
head -c 18432 "$TMP/a18433.txt" >"$TMP/a18432.txt" # (read, and then too long in tokens)
expect_error "prompt file at the bound" "$QEVICT" generate --model "$STORIES" \
  --prompt-file "$TMP/a18432.txt"
grep -q "exceeds the model context" "$TMP/err" || bad "18,432 bytes: $(cat "$TMP/err")"
# standard input from an endless pipe: refused once past the bound, having taken little more
python3 - "$QEVICT" "$STORIES" "$BOUND" <<'PY' || bad "--prompt-file - from an endless pipe"
import os, subprocess, sys
p = subprocess.Popen([sys.argv[1], "generate", "--model", sys.argv[2], "--prompt-file", "-"],
                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
sent, chunk = 0, b"a" * 65536
try:
    while sent < 3 << 30:
        sent += os.write(p.stdin.fileno(), chunk)
except BrokenPipeError:
    pass
err = p.stderr.read().decode()
rc = p.wait(timeout=60)
assert sent < 1 << 20, "%d bytes taken: %s" % (sent, err)
assert rc == 1 and "--prompt-file '-': " + sys.argv[3] in err, (rc, err)
print("ok --prompt-file - from an endless pipe: %d bytes taken, %s" % (sent, err.strip()),
      file=sys.stderr)
PY
expect_error "empty prompt" "$QEVICT" generate --model "$STORIES" --prompt ""
expect_error "bad -n" "$QEVICT" generate --model "$STORIES" --prompt hi -n -3
expect_error "bad --top-p" "$QEVICT" generate --model "$STORIES" --prompt hi --top-p 2
grep -q -- "--top-p (a number in \[1e-06, 1\])" "$TMP/err" || bad "--top-p 2: range not stated"
expect_error "-n past its range" "$QEVICT" generate --model "$STORIES" --prompt hi -n 99999999
grep -q -- "-n (an integer in 1..16777216)" "$TMP/err" || bad "-n 99999999: range not stated"
# a note belongs to the option that failed: not to an earlier budget parsed as bytes
expect_error "bad --scorer after a byte budget" "$QEVICT" generate --model "$STORIES" --prompt hi \
  --policy qevict --budget 2G --scorer foo
grep -q "(a number" "$TMP/err" && bad "--scorer foo: another option's range stated"
expect_error "bad --budget" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --budget abc
grep -q "(a fraction in (0, 1\] or bytes" "$TMP/err" || bad "--budget abc: forms not stated"
expect_error "tp beyond kv heads" "$QEVICT" generate --model "$STORIES" --prompt hi --tp 8
expect_error "unknown option" "$QEVICT" generate --model "$STORIES" --prompt hi --bogus 1
expect_error "--max-batch below the prompt" "$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" --max-batch 4
grep -q "max-batch 4 holds less than the prompt's 5 tokens" "$TMP/err" || bad "--max-batch 4: message"
expect_error "--max-batch without room for a prompt and the decode rows" "$QEVICT" generate \
  --model "$STORIES" --prompt "Once upon a time" --batch 3 --max-batch 7
grep -q "holds neither every prompt (15 tokens) nor one prompt of 5 tokens beside a decode row for each of the 3 sequences (8)" \
  "$TMP/err" || bad "--max-batch 7: message"
expect_error "bad --max-batch" "$QEVICT" generate --model "$STORIES" --prompt hi --max-batch 0
grep -q "bad value '0' for --max-batch (an integer in 1..16777216)" "$TMP/err" || bad "--max-batch 0: message"
# --max-batch 8 on three prompts of 5 tokens: a prompt a pass, the tokens of one pass for all three
# a tiered cache's step of more sequences than one backend call holds (64) goes in parts: it
# runs, and sequence 0 gets the tokens it gets alone (greedy)
b1=$("$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 8 --ignore-eos --policy qevict --budget 100000 --json 2>"$TMP/err" | tokens)
b65=$("$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 8 --batch 65 --ignore-eos --policy qevict --budget 100000 --json 2>"$TMP/err" | tokens)
[[ -n "$b1" && "$b1" == "$b65" ]] && echo "ok --batch 65 under qevict: the tokens of --batch 1" >&2 || bad "--batch 65 qevict: '$b65' against '$b1': $(cat "$TMP/err")"
# an output that cannot be written (a full disk) is an error, not exit 0
if [[ -w /dev/full ]]; then
  "$QEVICT" generate --model "$STORIES" --prompt hi -n 4 >/dev/full 2>"$TMP/err"
  rc=$?
  [[ $rc -eq 1 ]] && grep -q "writing the standard output failed" "$TMP/err" && echo "ok stdout on a full disk: exit 1, $(cat "$TMP/err")" >&2 || bad "stdout on /dev/full: exit $rc, $(cat "$TMP/err")"
fi
one=$("$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 30 --batch 3 --ignore-eos --json 2>/dev/null)
three=$("$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 30 --batch 3 --ignore-eos --json --max-batch 8 2>/dev/null)
python3 - "$one" "$three" <<'PY' || bad "--max-batch 8: passes or tokens"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sa, sb = a["summary"], b["summary"]
assert a["tokens"] == b["tokens"], "tokens differ"
assert sa["steps"] == 30 and sb["steps"] == 32, (sa["steps"], sb["steps"])  # 1 and 3 prefill passes
assert sa["decode_steps"] == sb["decode_steps"] == 29, (sa["decode_steps"], sb["decode_steps"])
assert sa["decode_tokens"] == 87 and sb["decode_tokens"] == 84, (sa["decode_tokens"], sb["decode_tokens"])
print("ok --max-batch 8: three passes of one prompt, the same tokens; decode_steps 29, "
      "decode_tokens 87 and 84", file=sys.stderr)
PY
expect_error "bad --cpu-weights" "$QEVICT" generate --model "$STORIES" --prompt hi --cpu-weights q3
expect_error "--cpu-weights with --device" "$QEVICT" generate --model "$STORIES" --prompt hi --cpu-weights packed --device 0
expect_error "eval --cpu-weights bad" "$QEVICT" eval --model "$STORIES" --cpu-weights x
expect_error "serve --cpu-weights bad" "$QEVICT" serve --model "$STORIES" --cpu-weights x
expect_error "unknown command" "$QEVICT" frobnicate
expect_error "version with an argument" "$QEVICT" version --bogus
"$QEVICT" version --help >"$TMP/out" 2>&1 && grep -q "^usage: qevict version" "$TMP/out" ||
  bad "version --help: $(cat "$TMP/out")"
# CUDA graphs switch: --no-graphs takes no value (QE_CUDA_GRAPHS is a knob: see below)
expect_error "--no-graphs with a value" "$QEVICT" generate --model "$STORIES" --prompt hi --no-graphs=1
# INT2 ledgers of windows of one token take a pool slot each (their bytes do not fill a page):
# the pool is sized for the slots the policy's INT2 share needs (these ran out of pool memory)
python3 -c "print('a' * 2045, end='')" >"$TMP/a2045.txt"
for pol in "kivi --window 1 --budget 0.3" "h2o --q 1 --budget 0.2" "qevict --q 1 --window 1 --budget 0.3"; do
  # shellcheck disable=SC2086
  "$QEVICT" generate --model "$STORIES" --prompt-file "$TMP/a2045.txt" -n 2 --policy $pol \
    >/dev/null 2>"$TMP/err" && echo "ok token-level INT2 under pressure: --policy $pol" >&2 ||
    bad "token-level INT2 (--policy $pol): $(tail -1 "$TMP/err")"
done
# --prompt-file - reads standard input (it looked for a file named '-'), also under --tp 2
printf 'Once upon a time' >"$TMP/p.txt"
want=$("$QEVICT" generate --model "$STORIES" --prompt-file "$TMP/p.txt" -n 8 --json 2>/dev/null | tokens)
for tp in 1 2; do
  got=$("$QEVICT" generate --model "$STORIES" --prompt-file - -n 8 --json --tp $tp <"$TMP/p.txt" \
    2>/dev/null | tokens)
  [[ -n "$want" && "$got" == "$want" ]] && echo "ok --prompt-file - (--tp $tp)" >&2 ||
    bad "--prompt-file - (--tp $tp): '$got' against '$want'"
done
expect_error "--graphkv without a policy" "$QEVICT" generate --model "$STORIES" --prompt hi --graphkv
grep -q "needs a scorer-based --policy" "$TMP/err" || bad "--graphkv alone: $(cat "$TMP/err")"
# --json's text keeps a token that decodes to a NUL byte, escaped (the text ended there)
echo '407 3 261 378' >"$TMP/nul_ids"
"$QEVICT" generate --model "$STORIES" --prompt Once -n 4 --json --force-ids "$TMP/nul_ids" \
  2>/dev/null | python3 -c "import json,sys; t=json.load(sys.stdin)['text']; \
assert t == ' upon\x00 a time', repr(t)" && echo "ok --json text past a NUL byte" >&2 ||
  bad "--json text cut at a NUL byte"
# the streamed text is --json's: the continuation keeps its leading space (it was dropped, as
# for a prompt's dummy prefix: "Once upon a" then "time,")
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a" -n 8 --ignore-eos >"$TMP/st.txt" \
  2>/dev/null
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a" -n 8 --ignore-eos --json 2>/dev/null |
  python3 -c "import json,sys; t=json.load(sys.stdin)['text']; s=open(sys.argv[1]).read(); \
assert s.rstrip('\n') == t and t.startswith(' '), (s, t)" "$TMP/st.txt" &&
  echo "ok streamed text equals --json's" >&2 || bad "streamed text: $(head -c 80 "$TMP/st.txt")"
# --json keeps a failed run's reason (the memory report's own lookups used to erase it)
expect_error "--json, budget below the protected regions" "$QEVICT" generate --model "$STORIES" \
  --prompt hi -n 8 --policy qevict --budget 0.6 --json
grep -q "below the cost of the protected regions" "$TMP/err" || bad "--json: $(cat "$TMP/err")"
# the environment's knobs (common/qe_env.h): a value a knob does not take is ignored with a
# warning naming it, and the run goes on; valid or empty values warn of nothing; every run gives
# the default run's tokens
want=$("$QEVICT" generate --model "$STORIES" --prompt hi -n 8 --policy qevict --budget 1 --json \
  2>/dev/null | tokens)
for kv in QE_CPU_SPIN_US=abc QE_CPU_SPIN_US=-5 QE_TIERED_GATHER=yes QE_CUDA_GRAPHS=yes \
  QE_CPU_SPIN_US=0 QE_CPU_SPIN_US=1000000 QE_TIERED_GATHER=1 QE_CUDA_GRAPHS=; do
  got=$(env "$kv" "$QEVICT" generate --model "$STORIES" --prompt hi -n 8 --policy qevict \
    --budget 1 --json 2>"$TMP/err" | tokens) || bad "$kv: exit $?"
  case "$kv" in
  *=abc | *=-5 | *=yes)
    grep -q "${kv%%=*}='${kv#*=}' ignored" "$TMP/err" || bad "$kv: no warning"
    [[ $(grep -c ignored "$TMP/err") == 1 ]] || bad "$kv: warned more than once" ;;
  *) [[ ! -s "$TMP/err" ]] || bad "$kv: stderr: $(cat "$TMP/err")" ;;
  esac
  [[ "$got" == "$want" ]] || bad "$kv: other tokens ($got, not $want)"
done
# on the CPU backend nothing is recorded, whatever the knob says; --json says so
for sw in "" "QE_CUDA_GRAPHS=0" "QE_CUDA_GRAPHS=1"; do
  envs=(); flags=()
  [[ $sw == QE_* ]] && envs=("$sw") || { [[ -n $sw ]] && flags=("$sw"); }
  env "${envs[@]}" "$QEVICT" generate --model "$STORIES" --prompt hi -n 3 --json "${flags[@]}" \
    >"$TMP/g.json" || bad "graphs switch '$sw' run"
  python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['graphs']; \
assert g == {'enabled': False, 'used': False, 'captures': 0, 'replays': 0, 'warmups': 0, \
'eager_steps': 0}, g" "$TMP/g.json" || bad "graphs report with '$sw'"
done
expect_error "unknown policy" "$QEVICT" generate --model "$STORIES" --prompt hi --policy lru
expect_error "window 0" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --window 0
expect_error "bits 3" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --bits 3
expect_error "q 1.5" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --q 1.5
for pol in h2o streaming snapkv; do # no quantized windows: --bits would be ignored
  expect_error "bits on $pol" "$QEVICT" generate --model "$STORIES" --prompt hi --policy $pol --bits 4
  grep -q -- "--bits: policy $pol keeps no quantized windows" "$TMP/err" || bad "bits on $pol: message"
done
"$QEVICT" generate --model "$STORIES" --prompt hi -n 2 --policy h2o --q 0.5 --bits 4 >/dev/null 2>&1 ||
  bad "h2o with --q 0.5 --bits 4 refused"
expect_error "key frame" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --key-frame diagonal
# window-relative (an experiment of the CPU cache) and pre-RoPE INT2 keys: run within budget
for kf in window pos; do
  "$QEVICT" generate --model "$STORIES" --prompt "Once upon a time there was a little girl" -n 150 \
    --ignore-eos --policy qevict --budget 0.4 --key-frame $kf --json >"$TMP/kf.json" 2>"$TMP/err" ||
    bad "--key-frame $kf"
  grep -q '"demotions":[1-9]' "$TMP/kf.json" || bad "--key-frame $kf: no window was quantized"
done
expect_error "budget below protected regions" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --budget 0.01
expect_error "bad budget" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --budget -2
expect_error "graphkv on streaming" "$QEVICT" generate --model "$STORIES" --prompt hi --policy streaming --graphkv
expect_error "bad graphkv" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict --graphkv=1,x
expect_error "diagnostics with full" "$QEVICT" generate --model "$STORIES" --prompt hi --diagnostics
expect_error "top2 without json" "$QEVICT" generate --model "$STORIES" --prompt hi --top2
expect_error "missing ids file" "$QEVICT" generate --model "$STORIES" --prompt hi --force-ids "$TMP/none"
echo "[3, -1]" >"$TMP/neg.ids"
expect_error "negative forced id" "$QEVICT" generate --model "$STORIES" --prompt hi --force-ids "$TMP/neg.ids"
echo "3 99999" >"$TMP/big.ids"
expect_error "forced id outside the vocabulary" "$QEVICT" generate --model "$STORIES" --prompt hi --force-ids "$TMP/big.ids"
: >"$TMP/empty.ids"
expect_error "no forced ids" "$QEVICT" generate --model "$STORIES" --prompt hi --force-ids "$TMP/empty.ids"
# --force-ids is parsed strictly: anything but a JSON array of integers or whitespace-separated
# integers is refused, naming the file and the offending token (these once became other ids)
for spec in "1.5 2|'1.5'" "0x10|'0x10'" "abc 7 xyz 9|'abc'" "[1, 2,]|']'" "[1 2]|'2'" \
    "[1, 2] 3|'3'" "1,2|','" "+3|'+3'" "99999999999|'99999999999'"; do
  printf '%s' "${spec%|*}" >"$TMP/bad.ids"
  expect_error "forced ids '${spec%|*}'" "$QEVICT" generate --model "$STORIES" --prompt hi -n 2 \
    --force-ids "$TMP/bad.ids"
  grep -qF "ids file '$TMP/bad.ids': expected" "$TMP/err" && grep -qF "got ${spec#*|}" "$TMP/err" ||
    bad "forced ids '${spec%|*}': $(cat "$TMP/err")"
done
expect_error "forced ids from a directory" "$QEVICT" generate --model "$STORIES" --prompt hi \
  --force-ids "$TMP"
grep -q "Is a directory" "$TMP/err" || bad "forced ids from a directory: $(cat "$TMP/err")"
printf ' [ 5 ,\n 6 ]\n' >"$TMP/ok.ids"
"$QEVICT" generate --model "$STORIES" --prompt hi -n 2 --json --force-ids "$TMP/ok.ids" \
  >"$TMP/ok.json" 2>"$TMP/err" && grep -q '"tokens":\[5,6\]' "$TMP/ok.json" ||
  bad "forced ids [5, 6]: $(cat "$TMP/err")"
# values once taken silently (the audit of 2026-12-04): -1, the unset mark, as a value; cache
# options without a policy; numbers past their type; leading blanks; GraphKV rounds past the cap
G=(generate --model "$STORIES" --prompt hi -n 2)
expect_error "--q -1" "$QEVICT" "${G[@]}" --policy qevict --q -1
expect_error "--window -1" "$QEVICT" "${G[@]}" --policy qevict --window -1
expect_error "--sink -1" "$QEVICT" "${G[@]}" --policy qevict --sink -1
expect_error "--sink past the context" "$QEVICT" "${G[@]}" --policy qevict --sink 1000000
expect_error "--budget without --policy" "$QEVICT" "${G[@]}" --budget 0.2
grep -q -- "--budget needs a tiered --policy" "$TMP/err" || bad "--budget without --policy: $(cat "$TMP/err")"
expect_error "--bits without --policy" "$QEVICT" "${G[@]}" --bits 4
expect_error "--budget past 2^63" "$QEVICT" "${G[@]}" --policy qevict --budget 99999999999999999999
expect_error "--seed ' -1'" "$QEVICT" "${G[@]}" --seed " -1"
expect_error "--graphkv rounds 65" "$QEVICT" "${G[@]}" --policy qevict --graphkv=0.3,8,65
expect_error "--graphkv rounds 2^31-1" "$QEVICT" "${G[@]}" --policy qevict --graphkv=0.3,8,2147483647
expect_error "--graphkv m past int" "$QEVICT" "${G[@]}" --policy qevict --graphkv=0.3,99999999999,1
"$QEVICT" "${G[@]}" --policy qevict --graphkv=0.3,8,64 >/dev/null 2>"$TMP/err" ||
  bad "--graphkv rounds 64: $(cat "$TMP/err")"
# --graphkv alone runs NAME+graphkv, and the reports now say so (they had said "qevict")
"$QEVICT" "${G[@]}" --policy qevict --graphkv --json 2>/dev/null | python3 -c '
import json, sys
p = json.load(sys.stdin)["memory"]["policy"]
assert p == "qevict+graphkv", p' || bad "--policy qevict --graphkv: memory.policy not qevict+graphkv"
expect_error "--time-allreduce without --device" "$QEVICT" "${G[@]}" --time-allreduce
grep -q -- "--time-allreduce .*: it needs --device" "$TMP/err" ||
  bad "--time-allreduce: $(cat "$TMP/err")"
# --no-graphs is a GPU switch too (it was taken on the CPU, where it does nothing)
expect_error "--no-graphs without --device" "$QEVICT" "${G[@]}" --no-graphs
grep -q -- "--no-graphs turns CUDA graphs off: it needs --device" "$TMP/err" ||
  bad "--no-graphs without --device: $(cat "$TMP/err")"
# integers (and the other numbers) with a leading '+' (strtol takes it: -n +5 was 5) or blank
for ov in "-n|+5" "-n| 5" "--max-batch|+512" "--threads|+1" "--seed|+3" "--top-p|+0.5" \
  "--window|+8"; do
  expect_error "${ov%|*} '${ov#*|}'" "$QEVICT" "${G[@]}" --policy qevict "${ov%|*}" "${ov#*|}"
  grep -qF -- "bad value '${ov#*|}' for ${ov%|*}" "$TMP/err" ||
    bad "${ov%|*} '${ov#*|}': $(cat "$TMP/err")"
done
# a --budget in bytes too small for a rank's share under --tp names the whole budget it takes
# (it named rank 0's share and that rank's minimum: "budget 3675 bytes is below ... 4220")
expect_error "--budget 16879 at --tp 3" "$QEVICT" generate --model "$STORIES" \
  --prompt "Once upon a time" -n 8 --tp 3 --policy qevict --budget 16879
grep -qF -- "--budget 16879 bytes at --tp 3 gives rank 0 4219 bytes" "$TMP/err" &&
  grep -qF -- "give at least 16880 bytes" "$TMP/err" || bad "--budget at --tp 3: $(cat "$TMP/err")"
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 8 --tp 3 --policy qevict \
  --budget 16880 >/dev/null 2>"$TMP/err" || bad "--budget 16880 at --tp 3: $(cat "$TMP/err")"
# a failure every rank shares is one line (rank 0's), not one a rank
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "--device 0 --tp 2 without a GPU" "$QEVICT" "${G[@]}" --device 0 --tp 2
fi
# --shape (no tokenizer): the output is the ids, one line
"$QEVICT" generate --shape tiny --prompt-len 4 -n 5 >"$TMP/ids.out" 2>"$TMP/err" || bad "--shape tiny"
[[ $(wc -w <"$TMP/ids.out") -eq 5 && $(wc -l <"$TMP/ids.out") -eq 1 ]] ||
  bad "--shape tiny printed '$(cat "$TMP/ids.out")'"
# a shape whose fp32 weights exceed the memory is refused up front (it once grew until killed)
expect_error "--shape llama3-70b on the CPU" "$QEVICT" generate --shape llama3-70b --prompt-len 4 -n 1
grep -q "fp32 weights take 282.2 GB" "$TMP/err" || bad "llama3-70b: $(cat "$TMP/err")"
# --budget in bytes takes the suffixes submit takes (it refused them)
b1=$("$QEVICT" generate --model "$STORIES" --prompt hi -n 100 --policy qevict --budget 60K --json \
  2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['memory']['budget_bytes'])")
[[ $b1 == 61440 ]] || bad "--budget 60K: budget_bytes '$b1', expected 61440"
expect_error "--budget with a bad suffix" "$QEVICT" generate --model "$STORIES" --prompt hi \
  --policy qevict --budget 10x
# the suffixes: K, M, G in either case, alone or with B or iB, and B; a lower-case b is bits and
# refused (100Kb was 100 KiB), naming --budget and the suffixes it takes
for b in 60KiB 60KB 60kB 61440B 0.05859375M; do
  "$QEVICT" generate --model "$STORIES" --prompt hi -n 2 --policy qevict --budget $b --json \
    >"$TMP/b.json" 2>/dev/null
  got=$(python3 -c "import json,sys; print(json.load(sys.stdin)['memory']['budget_bytes'])" \
    <"$TMP/b.json")
  [[ $got == 61440 ]] || bad "--budget $b: budget_bytes '$got', expected 61440"
done
SUFFIXES="(a fraction in (0, 1] or bytes with an optional suffix B, K, KB, KiB, M, MB, MiB, G, GB"
SUFFIXES="$SUFFIXES or GiB)"
for b in 100Kb 100kb 100b 1Gb 1GIB 100KiBx; do
  expect_error "--budget $b" "$QEVICT" generate --model "$STORIES" --prompt hi --policy qevict \
    --budget $b
  grep -qF "bad value '$b' for --budget $SUFFIXES" "$TMP/err" ||
    bad "--budget $b: $(cat "$TMP/err")"
done
# -n past the context: said, not cut silently
"$QEVICT" generate --model "$STORIES" --prompt hi -n 5000 --ignore-eos --json >"$TMP/out" \
  2>"$TMP/err" || bad "-n 5000 failed"
grep -q "warning: 5000 new tokens (-n) stop at the model's context of 2048 tokens" "$TMP/err" ||
  bad "-n past the context: no warning ($(cat "$TMP/err"))"
# serve, sched and worker take only their own options
expect_error "serve --rank" "$QEVICT" serve --model "$STORIES" --rank 7
expect_error "serve --worker-timeout" "$QEVICT" serve --model "$STORIES" --worker-timeout 100
expect_error "serve --max-message below 4K" "$QEVICT" serve --model "$STORIES" --max-message 1
expect_error "worker --workers" "$QEVICT" worker --model "$STORIES" --workers 9
expect_error "worker --keep-finished" "$QEVICT" worker --model "$STORIES" --keep-finished 5
expect_error "worker --shutdown-grace past a day" "$QEVICT" worker --model "$STORIES" \
  --shutdown-grace 90000
expect_error "worker --step-timeout negative" "$QEVICT" worker --model "$STORIES" \
  --step-timeout -1
expect_error "sched --step-timeout" "$QEVICT" sched --model "$STORIES" --state-dir "$TMP/st" \
  --step-timeout 9
expect_error "sched --shutdown-grace past a day" "$QEVICT" sched --model "$STORIES" \
  --state-dir "$TMP/st" --shutdown-grace 90000
expect_error "serve --shutdown-grace not a number" "$QEVICT" serve --model "$STORIES" \
  --shutdown-grace soon
expect_usage "serve --max-resumes negative" "--max-resumes: '-1' (an integer in 0..1000)" \
  "$QEVICT" serve --model "$STORIES" --max-resumes -1
expect_usage "worker --max-resumes" "--max-resumes is a scheduler option" "$QEVICT" worker \
  --model "$STORIES" --max-resumes 2
# an audit (2026-12-06): empty paths ("cannot create : No such file"), a group the scheduler
# refuses at each retry (the worker retried forever), hexadecimal numbers (--temp 0x10 was 16),
# an unknown policy (exit 1, after the model loaded)
expect_usage "serve --state-dir ''" "--state-dir: empty" "$QEVICT" serve --model "$STORIES" \
  --state-dir ""
expect_usage "sched --worker-listen ''" "--worker-listen: empty" "$QEVICT" sched \
  --model "$STORIES" --worker-listen ""
# a robustness sweep (2026-12-07): these named no option (a transport error at bind, "--scheduler"
# for a state directory too long for its sockets, "tp: create_cpu: bad path")
for w in bogus unix: "unix:/$(printf 'w%.0s' $(seq 110))"; do
  expect_usage "sched --worker-listen $w" "--worker-listen: transport:" "$QEVICT" sched \
    --model "$STORIES" --state-dir "$TMP/st" --worker-listen "$w"
done
expect_usage "serve --state-dir too long" "--state-dir '$TMP/$(printf 's%.0s' $(seq 100))' is \
too long" "$QEVICT" serve --model "$STORIES" --state-dir "$TMP/$(printf 's%.0s' $(seq 100))"
[[ ! -e "$TMP/$(printf 's%.0s' $(seq 100))" ]] || bad "serve made the too long --state-dir"
expect_usage "serve under a too long TMPDIR" "TMPDIR '" env TMPDIR="$TMP/$(printf 't%.0s' \
  $(seq 100))" "$QEVICT" serve --model "$STORIES"
expect_usage "worker --tp-addr ''" "--tp-addr: empty" "$QEVICT" worker --model "$STORIES" \
  --tp 2 --tp-addr ""
expect_usage "worker --tp-addr too long" "--tp-addr: a path of 120 bytes" "$QEVICT" worker \
  --model "$STORIES" --tp 2 --tp-addr "/$(printf 'p%.0s' $(seq 119))"
for g in "" "a b" "$(printf 'g%.0s' $(seq 64))"; do
  expect_usage "worker --group '$g'" "--group: 1..63 printable" timeout -s KILL 20 "$QEVICT" \
    worker --model "$STORIES" --scheduler "unix:$TMP/none.sock" --group "$g"
done
expect_usage "generate --temp 0x10" "bad value '0x10' for --temp" "$QEVICT" generate \
  --model "$STORIES" --prompt hi --temp 0x10
expect_usage "generate --policy lru" "bad value 'lru' for --policy (full, " "$QEVICT" generate \
  --model "$STORIES" --prompt hi --policy lru
expect_usage "eval --samples ''" "bad value '' for --samples (an integer" "$QEVICT" eval \
  --model "$STORIES" --samples ""
# generate's and eval's backend options (one check, cli_check_backend)
for c in "generate --prompt hi" eval; do
  expect_usage "$c --device 0 --cpu-weights packed" \
    "qevict ${c%% *}: --cpu-weights is for the CPU backend, not --device" "$QEVICT" $c \
    --model "$STORIES" --device 0 --cpu-weights packed
done
# serve's and worker's byte sizes go through the shared parser: no '+' or blank (their own
# strtoull took them, and the worker started)
for v in +4G " 4096" 4Gb; do
  expect_error "worker --pool-bytes '$v'" timeout -s KILL 20 "$QEVICT" worker --model "$STORIES" \
    --pool-bytes "$v"
  grep -qF "bad byte size for --pool-bytes: '$v' (bytes with an optional suffix" "$TMP/err" ||
    bad "--pool-bytes '$v': $(cat "$TMP/err")"
done
# a pool below the smallest request (2 tokens of FullKV on the rank) stops the worker at its
# load, before it connects (it had started, and every request was refused)
expect_error "worker --pool-bytes 1" timeout -s KILL 20 "$QEVICT" worker --model "$STORIES" \
  --scheduler "unix:$TMP/none.sock" --pool-bytes 1
grep -qF -- "--pool-bytes 1 cannot hold any request: the smallest, a one-token prompt and one new \
token, takes 2560 bytes of KV on this rank" "$TMP/err" || bad "--pool-bytes 1: $(cat "$TMP/err")"
# --pool-bytes N%: a share of the memory free once the model is loaded, 0 < N <= 100
for v in 0% 101% abc% % -5% nan% 1e999%; do
  expect_usage "worker --pool-bytes '$v'" \
    "--pool-bytes: '$v': a share of the free memory is N% with 0 < N <= 100" \
    "$QEVICT" worker --model "$STORIES" --pool-bytes "$v"
done
expect_usage "serve --pool-bytes 0%" "--pool-bytes: '0%': a share of the free memory" \
  "$QEVICT" serve --model "$STORIES" --pool-bytes 0%
# the worker takes its share of MemAvailable at its load (a tenth: within 25% of this script's
# reading, as other tests run beside it) and logs it; the last of --pool-bytes 10% and a byte
# size wins
mem_avail() { sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo; }
avail=$(mem_avail)
QEVICT_LOG=info timeout 3 "$QEVICT" worker --model "$STORIES" --scheduler "unix:$TMP/none.sock" \
  --pool-bytes 1G --pool-bytes 10% >/dev/null 2>"$TMP/err"
share=$(grep -o -- '--pool-bytes 10% of the [0-9]* MiB free: [0-9]* bytes' "$TMP/err")
read -r free_mib pool <<<"$(sed 's/.* the \([0-9]*\) MiB free: \([0-9]*\) bytes/\1 \2/' <<<"$share")"
if [[ -z $share ]] || ((pool < free_mib * 104857 || pool > (free_mib + 1) * 104858)) ||
  ((free_mib * 1024 < avail * 3 / 4 || free_mib * 1024 > avail * 5 / 4)); then
  bad "worker --pool-bytes 10%: '$share' (MemAvailable $avail kB): $(head -3 "$TMP/err")"
else
  echo "ok worker --pool-bytes 10%: $share" >&2
fi
QEVICT_LOG=info timeout 3 "$QEVICT" worker --model "$STORIES" --scheduler "unix:$TMP/none.sock" \
  --pool-bytes 10% --pool-bytes 1G >/dev/null 2>"$TMP/err"
grep -q -- '--pool-bytes .*% of the' "$TMP/err" && bad "--pool-bytes 10% then 1G: took a share"
expect_error "sched --cpu" "$QEVICT" sched --model "$STORIES" --state-dir "$TMP/st" --cpu
expect_error "serve --bogus at the end" "$QEVICT" serve --model "$STORIES" --bogus
grep -q "unknown option" "$TMP/err" || bad "serve --bogus: $(cat "$TMP/err")"
# serve's temporary state directory goes without a shell: a quote in TMPDIR is part of a name
QT="$TMP/q';touch $TMP/injected;'x"
mkdir -p "$QT"
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \
print(s.getsockname()[1])"; }
TMPDIR="$QT" "$QEVICT" serve --model "$STORIES" --listen "127.0.0.1:$(free_port)" \
  --metrics-listen "127.0.0.1:$(free_port)" --ready-file "$TMP/ready" 2>"$TMP/serve.err" &
spid=$!
ready=0
for _ in $(seq 600); do [[ -f "$TMP/ready" ]] && ready=1 && break; sleep 0.1; done
kill -TERM "$spid"
wait "$spid" || bad "serve under a quoted TMPDIR: exit $?: $(tail -2 "$TMP/serve.err")"
((ready)) || bad "serve under a quoted TMPDIR never got ready"
[[ ! -e "$TMP/ready" ]] || bad "serve left its ready file once stopped"
[[ ! -e "$TMP/injected" ]] || bad "serve ran TMPDIR as shell code"
[[ -z "$(ls -A "$QT")" ]] || bad "serve left its state directory: $(ls -A "$QT")"
# serve killed outright (SIGKILL) takes its scheduler and worker along (their parent-death
# signal), and a worker that fails again within 3 s of each restart stops serve after 5 tries
# (with pauses of 1, 2, 4 and 8 s), where it used to restart it every second forever
cp "$STORIES" "$TMP/m.gguf"
serve_up() { # STATE: serve on $TMP/m.gguf in the background ($spid), ready or a failure
  rm -f "$TMP/ready"
  "$QEVICT" serve --model "$TMP/m.gguf" --state-dir "$1" --listen "127.0.0.1:$(free_port)" \
    --metrics-listen "127.0.0.1:$(free_port)" --ready-file "$TMP/ready" 2>"$TMP/serve.err" &
  spid=$!
  for _ in $(seq 600); do [[ -f "$TMP/ready" ]] && return 0; sleep 0.1; done
  bad "serve on $1 never got ready: $(tail -2 "$TMP/serve.err")"
}
serve_up "$TMP/st_kill"
kill -KILL "$spid"
wait "$spid" 2>/dev/null
for _ in $(seq 100); do pgrep -f "state-dir $TMP/st_kill" >/dev/null || break; sleep 0.1; done
pgrep -f "state-dir $TMP/st_kill" >/dev/null && bad "serve's children outlived it: \
$(pgrep -af "state-dir $TMP/st_kill")" && pkill -KILL -f "state-dir $TMP/st_kill"
serve_up "$TMP/st_loop"
echo "not a gguf" >"$TMP/m.gguf"
pkill -KILL -f "qevict worker --model $TMP/m.gguf"
for _ in $(seq 400); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$spid" 2>/dev/null; then
  bad "serve still restarting a failing worker after 40 s"
  kill -TERM "$spid"
fi
wait "$spid"
rc=$?
[[ $rc -eq 1 ]] && grep -q "each of its last 5 starts: stopping" "$TMP/serve.err" ||
  bad "a worker failing at each restart: serve exit $rc: $(tail -2 "$TMP/serve.err")"
# a gRPC port past 65535 is refused (gRPC took it modulo 65536), and so is a listen address
# without a port (gRPC looked "bogus" up as a host and logged its own error line first)
for a in 127.0.0.1:99999 bogus 127.0.0.1: localhost:abc unix: :50051 "[::1]"; do
  "$QEVICT" sched --model "$STORIES" --state-dir "$TMP/st_port" --listen "$a" \
    --metrics-listen "" --worker-listen "unix:$TMP/w.sock" 2>"$TMP/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -qF -- "--listen '$a' needs a port" "$TMP/err" ||
    bad "--listen $a: exit $rc: $(cat "$TMP/err")"
done

"$QEVICT" inspect "$STORIES" >"$TMP/inspect" || bad "inspect stories"
grep -q "kv heads: 4" "$TMP/inspect" || bad "inspect shows kv heads"

same_tp() { # MODEL PROMPT N TP...
  local model="$1" prompt="$2" n="$3"; shift 3
  "$QEVICT" generate --model "$model" --prompt "$prompt" -n "$n" --json --ignore-eos | tokens >"$TMP/tp1" || bad "tp 1 run"
  for tp in "$@"; do
    "$QEVICT" generate --model "$model" --prompt "$prompt" -n "$n" --json --ignore-eos --tp "$tp" | tokens >"$TMP/tpn" || bad "tp $tp run"
    cmp -s "$TMP/tp1" "$TMP/tpn" && echo "ok tp $tp == tp 1 on $(basename "$model")" >&2 || bad "tp $tp differs on $model"
  done
}
same_tp "$STORIES" "Once upon a time" 100 2 4

# --top2 and --force-ids: the top-2 ids are the greedy choice and a different runner-up with a
# smaller logit; forcing a run's own tokens agrees at every step; forcing other tokens feeds them
# back (the output is the forced ids) and agrees only where they equal the greedy choice; --tp 2
# reports one entry per rank.
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 40 --ignore-eos --json --top2 \
  >"$TMP/t2.json" || bad "--top2 run"
python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['tokens'])))" \
  "$TMP/t2.json" >"$TMP/own.ids"
python3 -c "import json,sys; print(json.dumps([(i * 7 + 3) % 512 for i in range(40)]))" >"$TMP/other.ids"
for f in own other; do
  "$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 40 --ignore-eos --json --top2 \
    --force-ids "$TMP/$f.ids" --tp 2 >"$TMP/f_$f.json" || bad "--force-ids $f run"
done
python3 - "$TMP/t2.json" "$TMP/f_own.json" "$TMP/f_other.json" "$TMP/other.ids" <<'PY' || bad "--top2/--force-ids"
import json, sys
t, own, other = (json.load(open(p)) for p in sys.argv[1:4])
ids = json.load(open(sys.argv[4]))
assert len(t["top2"]) == 40, len(t["top2"])
for tok, (a, la, b, lb) in zip(t["tokens"], t["top2"]):
    assert a == tok and b != a and lb <= la, (tok, a, la, b, lb)
assert own["forced"] == 40 and own["agree"] == 40 and own["tokens"] == t["tokens"], own["agree"]
assert other["tokens"] == ids, other["tokens"][:5]
want = sum(1 for i, (a, _, _, _) in zip(ids, other["top2"]) if a == i)
assert other["agree"] == want, (other["agree"], want)
assert [r["rank"] for r in own["ranks"]] == [0, 1] and own["ranks"][1]["weight_bytes"] > 0, own["ranks"]
print("ok --top2, --force-ids (agree %d of 40 on other ids), ranks" % other["agree"], file=sys.stderr)
PY

# qevict at a budget that holds everything reproduces FullKV (the golden tokens for stories).
golden=$(python3 -c "import json; print(json.load(open('$(dirname "$STORIES")/stories260K.golden.json'))['cases']['Once upon a time']['tokens'])")
for pol in qevict qevict+graphkv h2o; do
  got=$("$QEVICT" generate --model "$STORIES" --prompt "Once upon a time" -n 196 --ignore-eos --json \
        --policy "$pol" --budget 1 | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['prompt_tokens']+d['tokens'])")
  [[ "$got" == "$golden" ]] && echo "ok $pol at 100% == golden" >&2 || bad "$pol at 100% differs from golden"
done
# At 20% a tiered run stays within its budget and uses INT2 windows; --trace writes events.
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a time there was a little girl" -n 150 \
  --ignore-eos --json --policy qevict --budget 0.4 --trace "$TMP/trace.jsonl" >"$TMP/q.json" || bad "qevict 40%"
python3 - "$TMP/q.json" "$TMP/trace.jsonl" <<'PY' || bad "qevict 40% memory"
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
ev = [json.loads(l) for l in open(sys.argv[2])]
assert m["bytes"] <= m["budget_bytes"] and m["peak_bytes"] <= m["budget_bytes"], m
assert m["windows_int2"] > 0 and m["demotions"] > 0, m
assert len(ev) == m["routing_events"] and all(e["bytes"] <= e["budget"] for e in ev)
print(f"ok qevict 40%: {m['bytes']} <= {m['budget_bytes']} bytes, {m['windows_int2']} INT2 windows, {len(ev)} events", file=sys.stderr)
PY
# --tp 3 --json gives every rank's memory summary under "ranks", and "memory" (rank 0's) says so
# (it gave rank 0's alone, unlabelled): stories260K's 4 KV heads split 1 + 1 + 2, so rank 2 holds
# twice rank 0's budget, and the ranks' budgets sum to the --tp 1 run's
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a time there was a little girl" -n 150 \
  --ignore-eos --json --policy qevict --budget 0.4 --tp 3 >"$TMP/q3.json" || bad "qevict 40% tp 3"
python3 - "$TMP/q.json" "$TMP/q3.json" <<'PY' || bad "--tp 3: every rank's memory"
import json, sys
one, three = (json.load(open(p)) for p in sys.argv[1:3])
m, ranks = three["memory"], three["ranks"]
assert one["memory"]["rank"] == 0 and m["rank"] == 0 and [r["rank"] for r in ranks] == [0, 1, 2], m
assert ranks[0]["memory"] == {k: v for k, v in m.items() if k != "rank"}, (m, ranks[0])
b = [r["memory"]["budget_bytes"] for r in ranks]
assert b[2] == 2 * b[0] == 2 * b[1] and sum(b) == one["memory"]["budget_bytes"], b
assert all(0 < r["memory"]["bytes"] <= r["memory"]["budget_bytes"] for r in ranks), ranks
print("ok --tp 3: each rank's memory, budgets %s of %d" % (b, one["memory"]["budget_bytes"]),
      file=sys.stderr)
PY
# the text gives every rank's memory summary too, one line a rank, labelled, each that rank's
# figures in --json's "ranks" (it gave rank 0's alone)
"$QEVICT" generate --model "$STORIES" --prompt "Once upon a time there was a little girl" -n 150 \
  --ignore-eos --policy qevict --budget 0.4 --tp 3 >/dev/null 2>"$TMP/q3.err" ||
  bad "qevict 40% tp 3, text"
python3 - "$TMP/q3.json" "$TMP/q3.err" <<'PY' || bad "--tp 3: every rank's memory in the text"
import json, re, sys
ranks = json.load(open(sys.argv[1]))["ranks"]
pat = (r"qevict: memory \(policy qevict, rank (\d+)\): budget (\d+) bytes, persistent (\d+) "
       r"\(peak (\d+)\):.* routing events (\d+);")
got = [tuple(map(int, m.groups())) for m in re.finditer(pat, open(sys.argv[2]).read())]
want = [(r["rank"], r["memory"]["budget_bytes"], r["memory"]["bytes"], r["memory"]["peak_bytes"],
         r["memory"]["routing_events"]) for r in ranks]
assert got == want, (got, want)
print("ok --tp 3: the text's memory lines, one a rank: %s" % got, file=sys.stderr)
PY
if [[ -n "${QE_SMOLLM2:-}" && -f "$QE_SMOLLM2" ]]; then
  same_tp "$QE_SMOLLM2" "The capital of France is" 48 2 3
  full=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" -n 48 --ignore-eos --json | tokens)
  q100=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" -n 48 --ignore-eos --json --policy qevict --budget 1 | tokens)
  [[ "$full" == "$q100" ]] && echo "ok qevict 100% == full on SmolLM2" >&2 || bad "qevict 100% differs on SmolLM2"
  q2=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" -n 48 --ignore-eos --json --policy qevict --budget 1 --tp 2 | tokens)
  [[ "$full" == "$q2" ]] && echo "ok qevict 100% tp 2 == full on SmolLM2" >&2 || bad "qevict 100% tp 2 differs"
  # SmolLM2's 3 KV heads split 1 + 2 over --tp 2: a byte budget is shared by KV heads, as the
  # daemon's workers share it (rank 0, whose memory the JSON reports, holds a third; it had half)
  rb=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" -n 8 --ignore-eos --json --policy qevict --budget 3000000 --tp 2 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["memory"]["budget_bytes"])')
  [[ "$rb" == 1000000 ]] && echo "ok --tp 2 shares a byte budget by KV heads (rank 0: $rb of 3000000)" >&2 ||
    bad "--tp 2 byte budget share: rank 0 got $rb of 3000000 (1000000 expected)"
  # packed weights (the Q4_1/Q8_0 blocks kept as they are): the fp32 weights' tokens, also at
  # tp 2 and under qevict 30%, with under 60% of the weight bytes
  # (qevict 30% with 300 new tokens: of 48, 30% was below the sink and local windows' minimum,
  # both runs failed alike, and their empty outputs compared equal)
  for extra in "-n 48" "-n 48 --tp 2" "-n 300 --policy qevict --budget 0.3"; do
    # shellcheck disable=SC2086
    a=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" --ignore-eos --json $extra | tokens)
    # shellcheck disable=SC2086
    b=$("$QEVICT" generate --model "$QE_SMOLLM2" --prompt "The capital of France is" --ignore-eos --json $extra --cpu-weights packed | tokens)
    [[ -n "$a" && "$a" == "$b" ]] && echo "ok --cpu-weights packed == f32 on SmolLM2 ($extra)" >&2 || bad "--cpu-weights packed differs or failed ($extra)"
  done
  "$QEVICT" generate --model "$QE_SMOLLM2" --prompt hi -n 2 --json --cpu-weights packed >"$TMP/pk.json" || bad "packed run"
  "$QEVICT" generate --model "$QE_SMOLLM2" --prompt hi -n 2 --json >"$TMP/f32.json" || bad "f32 run"
  python3 - "$TMP/pk.json" "$TMP/f32.json" <<'PY' || bad "packed weight bytes"
import json, sys
pk, f = (json.load(open(p))["ranks"][0]["weight_bytes"] for p in sys.argv[1:3])
assert pk * 10 < f * 6, (pk, f)
print(f"ok packed weights: {pk} bytes against {f} fp32", file=sys.stderr)
PY
else
  echo "note: SmolLM2 absent, its tp check skipped" >&2
fi
exit $fail
