#!/usr/bin/env bash
# test_cli_client: the client commands of qevict (submit, watch, cancel, tenant, requests,
# drain) where no server is needed: every --help exits 0; bad options and values exit 2 with
# one line naming the option; good values get past parsing to the network; a port nothing
# listens on (TCP or Unix) gives UNAVAILABLE and exit 1; a peer that accepts and never answers
# gives DEADLINE_EXCEEDED under --timeout; SIGINT cancels a stream or call cleanly (exit 130).
set -uo pipefail
QEVICT="$1"
TMP=$(mktemp -d)
BH_PID=
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  [[ -n "$BH_PID" ]] && kill "$BH_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
unset QEVICT_SERVER QEVICT_API_KEY QEVICT_ADMIN_KEY http_proxy https_proxy grpc_proxy
# Every command runs under a wall-clock guard so that a hang fails the test instead of stalling.
run() { timeout -s KILL 60 "$@" >"$TMP/out" 2>"$TMP/err"; }

# expect_usage DESCRIPTION NEEDLE CMD...: exit 2, one stderr line that contains NEEDLE.
expect_usage() {
  local what="$1" needle="$2"; shift 2
  run "$@"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  [[ $rc -eq 2 ]] || bad "$what: exit $rc, expected 2"
  [[ $lines -eq 1 ]] || { bad "$what: $lines stderr lines"; cat "$TMP/err" >&2; }
  grep -qF -- "$needle" "$TMP/err" || bad "$what: stderr does not name '$needle': $(cat "$TMP/err")"
  echo "ok ($rc) $what: $(head -1 "$TMP/err")" >&2
}

# expect_rpc DESCRIPTION RC NEEDLE CMD...: exit RC, stderr contains NEEDLE.
expect_rpc() {
  local what="$1" want="$2" needle="$3"; shift 3
  run "$@"
  local rc=$?
  [[ $rc -eq $want ]] || { bad "$what: exit $rc, expected $want"; cat "$TMP/err" >&2; }
  grep -qF -- "$needle" "$TMP/err" || bad "$what: stderr lacks '$needle': $(cat "$TMP/err")"
  echo "ok ($rc) $what: $(head -1 "$TMP/err")" >&2
}

# --help of every command and verb: exit 0, a usage line on stdout.
for cmd in submit watch cancel requests drain tenant "tenant set" "tenant get" "tenant list" \
  "tenant delete"; do
  # shellcheck disable=SC2086
  run "$QEVICT" $cmd --help
  rc=$?
  [[ $rc -eq 0 ]] || bad "$cmd --help: exit $rc"
  grep -q "^usage: qevict $cmd" "$TMP/out" || bad "$cmd --help: no usage line"
done
run "$QEVICT" --help
grep -q "submit" "$TMP/out" || bad "qevict --help lists no client commands"

# A free TCP port (bound, then closed: nothing listens on it).
DEAD=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
S="--server=127.0.0.1:$DEAD"

# Bad options and values: exit 2 and a message that names the option.
expect_usage "negative -n" "-n" "$QEVICT" submit --prompt hi -n -3
expect_usage "-n 0" "-n" "$QEVICT" submit --prompt hi -n 0
expect_usage "unknown --state" "--state" "$QEVICT" requests --state bogus
# ports gRPC would take modulo 65536 or cut (reaching another port), an IP address without one
# (gRPC dialed port 0), no host, a bare IPv6 address (its port cannot be told), an empty socket
# path
for a in 127.0.0.1:83616 127.0.0.1:80x 127.0.0.1:0 "[::1]:99999" dns:///localhost:70000 \
  ipv4:127.0.0.1:83616,127.0.0.2:50051 127.0.0.1:-5 127.0.0.1: localhost:abc 127.0.0.1 "[::1]" \
  dns:///127.0.0.1 :1 ::1:1 "[]:1" unix: unix:// ipv4:127.0.0.1:1,127.0.0.2; do
  expect_usage "--server $a" "bad server address '$a'" "$QEVICT" submit --server "$a" --prompt hi
done
expect_usage "QEVICT_SERVER with a bad port" "(QEVICT_SERVER)" env QEVICT_SERVER=localhost:99999 \
  "$QEVICT" tenant list
expect_usage "bench serve --server with a bad port" "bad server address" "$QEVICT" bench serve \
  --server 127.0.0.1:70000 --requests 1
# a host name alone (gRPC's resolver gives it port 443) and gRPC's other schemes: not refused
for a in localhost dns:///localhost xds:///svc unix-abstract:qevict-none; do
  run "$QEVICT" tenant list --server "$a" --timeout 1
  [[ $? -ne 2 ]] || bad "--server $a refused as a usage error: $(cat "$TMP/err")"
done
# a worker's malformed --scheduler is refused before its model loads (it once retried forever)
expect_usage "worker --scheduler with a bad port" "--scheduler: transport: bad port" "$QEVICT" \
  worker --model "$0" --scheduler 127.0.0.1:99999
expect_usage "--state with a bad item" "--state" "$QEVICT" requests --state running,done
expect_usage "budget 0" "--budget" "$QEVICT" submit --prompt hi --budget 0
expect_usage "budget 1.5" "--budget" "$QEVICT" submit --prompt hi --budget 1.5
expect_usage "budget -2" "--budget" "$QEVICT" submit --prompt hi --budget -2
expect_usage "budget 12X" "--budget" "$QEVICT" submit --prompt hi --budget 12X
expect_usage "watch without ID" "ID" "$QEVICT" watch
expect_usage "cancel without ID" "ID" "$QEVICT" cancel
expect_usage "tenant get without ID" "ID" "$QEVICT" tenant get
# options before the verb are the verb's (the bad address reaches the verb's parser)
expect_usage "tenant option before the verb" "bad server address" "$QEVICT" tenant \
  --server 127.0.0.1:70000 --json list
expect_usage "tenant options, no verb" "missing verb" "$QEVICT" tenant --server 127.0.0.1:1
# (the verb had been taken for --bogus's value: "missing verb")
expect_usage "tenant, an unknown option before the verb" "unknown option '--bogus'" "$QEVICT" \
  tenant --bogus list
expect_usage "tenant, an option without its value, no verb" "--server needs a value" "$QEVICT" \
  tenant --server
expect_usage "tenant --force before the verb" "bad server address" "$QEVICT" tenant --force \
  --server 127.0.0.1:70000 delete acme
expect_usage "tenant delete without ID" "ID" "$QEVICT" tenant delete --force
expect_usage "tenant set without --quota" "--quota" "$QEVICT" tenant set acme
expect_usage "tenant set --quota 0" "--quota" "$QEVICT" tenant set acme --quota 0
expect_usage "tenant set --quota 5X" "--quota" "$QEVICT" tenant set acme --quota 5X
expect_usage "tenant set bad ID" "ID" "$QEVICT" tenant set 'a b' --quota 1G
expect_usage "tenant set bad --default-policy" "--default-policy" "$QEVICT" tenant set acme --quota 1G --default-policy lru
expect_usage "tenant set --default-budget 0" "--default-budget" "$QEVICT" tenant set acme --quota 1G --default-budget 0
expect_usage "tenant without verb" "verb" "$QEVICT" tenant
expect_usage "tenant unknown verb" "frob" "$QEVICT" tenant frob
echo hello >"$TMP/prompt.txt"
expect_usage "--prompt and --prompt-file" "--prompt-file" "$QEVICT" submit --prompt hi --prompt-file "$TMP/prompt.txt"
# ... reported before any input is read: standard input that never ends (a FIFO held open here)
# is not waited for (bench latency read all of it first: test_bench_latency)
mkfifo "$TMP/open"
exec 3<>"$TMP/open"
for cmd in submit "bench serve"; do
  # shellcheck disable=SC2086
  expect_usage "$cmd --prompt with --prompt-file - on an endless input" "--prompt-file" \
    "$QEVICT" $cmd --prompt hi --prompt-file - <"$TMP/open"
done
exec 3>&-
expect_usage "no prompt" "--prompt" "$QEVICT" submit
expect_usage "unreadable prompt file" "--prompt-file" "$QEVICT" submit --prompt-file "$TMP/absent.txt"
expect_usage "prompt file is a directory" "--prompt-file" "$QEVICT" submit --prompt-file "$TMP"
printf 'Once upon\0 a time' >"$TMP/nul.txt"
expect_usage "a NUL byte in the prompt file" "NUL byte" "$QEVICT" submit --prompt-file "$TMP/nul.txt"
: >"$TMP/empty.txt"
expect_usage "empty prompt file" "empty" "$QEVICT" submit --prompt-file "$TMP/empty.txt"
expect_usage "empty --prompt" "empty" "$QEVICT" submit --prompt ""
# a prompt file is read no further than the most one request carries (64 MiB less 64 KiB)
ZERO="--prompt-file '/dev/zero': larger than 67043328 bytes (63.9 MiB), the most one request"
ZERO="$ZERO message carries"
expect_usage "prompt file /dev/zero" "$ZERO" "$QEVICT" submit "$S" --prompt-file /dev/zero
expect_usage "bench serve, prompt file /dev/zero" "$ZERO" "$QEVICT" bench serve "$S" --requests 1 \
  --prompt-file /dev/zero
# integers with a leading '+' (strtol takes it: -n +5 was 5) and byte sizes in bits (100Kb was
# 100 KiB) are refused, naming the option (and a size's suffixes)
expect_usage "-n +5" "bad value '+5' for -n" "$QEVICT" submit "$S" --prompt hi -n +5
# an audit (2026-12-06): hexadecimal numbers (strtod took --temp 0x10 as 16), a synthetic
# prompt's length with a given prompt (ignored), a list's empty item (skipped), and a value's
# control bytes (echoed raw to the terminal)
expect_usage "--temp 0x10" "bad value '0x10' for --temp" "$QEVICT" submit "$S" --prompt hi \
  --temp 0x10
expect_usage "bench serve --input-words with --prompt" "--input-words makes the prompts" \
  "$QEVICT" bench serve "$S" --prompt hi --input-words 5
expect_usage "bench serve --goodput with an empty item" "--goodput: an empty item" \
  "$QEVICT" bench serve "$S" --goodput ttft:5,
expect_usage "--request-id with a control byte" "--request-id" "$QEVICT" submit "$S" \
  --prompt hi --request-id $'a\x1b[31m'
grep -qF 'a\x1b[31m' "$TMP/err" && ! grep -q $'\x1b' "$TMP/err" ||
  bad "--request-id's ESC sent raw: $(cat -A "$TMP/err")"
# (a blank passed the client, whose help said "printable ASCII", and the scheduler refused it)
expect_usage "--request-id with a blank" "for --request-id (1..128 printable \
ASCII characters, no blank)" "$QEVICT" submit "$S" --prompt hi --request-id "a b"
# a server that cannot be reached stops bench serve after its first wave (4M requests to a dead
# port had run on for minutes)
run "$QEVICT" bench serve "$S" --prompt hi -n 2 --requests 1000000
rc=$?
[[ $rc -eq 1 ]] && grep -q "completed 0, failed [1-8], not sent 99999[2-9]" "$TMP/out" ||
  bad "bench serve to a dead port: exit $rc, $(head -2 "$TMP/out") $(head -1 "$TMP/err")"
expect_usage "a 3000-byte value, its message cut and marked" "... (see qevict submit --help)" \
  "$QEVICT" submit "$S" --prompt hi --temp "$(printf '9%.0s' $(seq 3000))"
expect_usage "--window +8" "--window" "$QEVICT" submit "$S" --prompt hi --window +8
expect_usage "--limit +5" "--limit" "$QEVICT" requests "$S" --limit +5
expect_usage "--from +1" "--from" "$QEVICT" watch r1 "$S" --from +1
SFX="bytes with an optional suffix B, K, KB, KiB, M, MB, MiB, G, GB or GiB)"
expect_usage "budget 100Kb" "bad value '100Kb' for --budget (a fraction in (0, 1] or $SFX" \
  "$QEVICT" submit "$S" --prompt hi --budget 100Kb
expect_usage "tenant set --quota 1Gb" "bad value '1Gb' for --quota ($SFX" "$QEVICT" tenant set \
  acme "$S" --quota 1Gb
expect_usage "bad --ids" "--ids" "$QEVICT" submit --ids 1,,2
expect_usage "negative --ids" "--ids" "$QEVICT" submit --ids 1,-2
expect_usage "--chat with --ids" "--chat" "$QEVICT" submit --ids 1,2 --chat
expect_usage "--system without --chat" "--system" "$QEVICT" submit --prompt hi --system x
expect_usage "--temp -1" "--temp" "$QEVICT" submit --prompt hi --temp -1
expect_usage "--top-p 2" "--top-p" "$QEVICT" submit --prompt hi --top-p 2
expect_usage "--top-k -1" "--top-k" "$QEVICT" submit --prompt hi --top-k -1
expect_usage "--seed -1" "--seed" "$QEVICT" submit --prompt hi --seed -1
expect_usage "unknown policy" "--policy" "$QEVICT" submit --prompt hi --policy lru
expect_usage "--bits 3" "--bits" "$QEVICT" submit --prompt hi --bits 3
expect_usage "--q 1.5" "--q" "$QEVICT" submit --prompt hi --q 1.5
expect_usage "--window 0" "--window" "$QEVICT" submit --prompt hi --window 0
expect_usage "--window 257" "--window" "$QEVICT" submit --prompt hi --window 257
expect_usage "--sink -1" "--sink" "$QEVICT" submit --prompt hi --sink -1
expect_usage "--scorer bogus" "--scorer" "$QEVICT" submit --prompt hi --scorer bogus
expect_usage "bad --graphkv" "--graphkv" "$QEVICT" submit --prompt hi --graphkv=1,x
expect_usage "--graphkv k 0" "--graphkv" "$QEVICT" submit --prompt hi --graphkv=0,8,1
expect_usage "--graphkv rounds 65" "--graphkv" "$QEVICT" submit --prompt hi --graphkv=0.3,8,65
expect_usage "--graphkv m past int" "--graphkv" "$QEVICT" submit --prompt hi --graphkv=0.3,99999999999,1
expect_usage "--graphkv T -1" "--graphkv" "$QEVICT" submit --prompt hi --graphkv=0.3,8,-1
expect_usage "empty --stop" "--stop" "$QEVICT" submit --prompt hi --stop ""
stops=()
for i in $(seq 17); do stops+=(--stop "s$i"); done
expect_usage "17 stop strings" "--stop" "$QEVICT" submit --prompt hi "${stops[@]}"
expect_usage "--request-id too long" "--request-id" "$QEVICT" submit --prompt hi --request-id "$(printf 'x%.0s' $(seq 129))"
expect_usage "unknown option" "--bogus" "$QEVICT" submit --prompt hi --bogus 1
expect_usage "missing value" "--server" "$QEVICT" submit --prompt hi --server
expect_usage "--json with a value" "--json" "$QEVICT" submit --prompt hi --json=yes
expect_usage "--timeout 0" "--timeout" "$QEVICT" submit --prompt hi --timeout 0
expect_usage "--timeout x" "--timeout" "$QEVICT" cancel r1 --timeout x
expect_usage "--from -1" "--from" "$QEVICT" watch r1 --from -1
expect_usage "--limit -1" "--limit" "$QEVICT" requests --limit -1
expect_usage "requests takes no argument" "extra" "$QEVICT" requests extra
expect_usage "watch with two IDs" "b" "$QEVICT" watch a b
expect_usage "--key-file absent" "--key-file" "$QEVICT" submit --prompt hi --key-file "$TMP/absent.key"
expect_usage "--key-file empty" "--key-file" "$QEVICT" cancel r1 --key-file "$TMP/empty.txt"
expect_usage "--key and --key-file" "--key-file" "$QEVICT" cancel r1 --key k --key-file "$TMP/prompt.txt"
expect_usage "--key not printable" "--key" "$QEVICT" cancel r1 --key "$(printf 'a\tb')"
expect_usage "--admin-key-file absent" "--admin-key-file" "$QEVICT" tenant list --admin-key-file "$TMP/absent.key"
expect_usage "--key on an admin command" "--key" "$QEVICT" drain --key k
expect_usage "empty WORKER" "WORKER" "$QEVICT" drain ""

# Good values get past parsing: the command reaches the network and reports UNAVAILABLE.
U="UNAVAILABLE:"
expect_rpc "submit, dead port" 1 "qevict submit: $U" "$QEVICT" submit --prompt hi "$S"
expect_rpc "submit --detach, dead port" 1 "qevict submit: $U" "$QEVICT" submit --prompt hi --detach "$S"
expect_rpc "submit with every option" 1 "qevict submit: $U" "$QEVICT" submit --prompt-file "$TMP/prompt.txt" \
  --chat --system "be brief" -n 64 --temp 0.7 --top-k 40 --top-p 0.9 --seed 7 --stop END --stop "\n\n" \
  --policy qevict+graphkv --budget 512M --q 0.5 --window 16 --bits 4 --sink 4 --local 64 \
  --scorer decayed --graphkv=0.3,8,1 --request-id job-1 --ignore-eos --json --key k "$S"
for b in 0.25 1 1.0 4096 64K 1.5G 2GiB 100B; do
  expect_rpc "budget $b accepted" 1 "$U" "$QEVICT" submit --ids 1,2,3 --budget "$b" --graphkv "$S"
done
expect_rpc "watch, dead port" 1 "qevict watch: $U" "$QEVICT" watch r1 --from 3 "$S"
expect_rpc "cancel, dead port" 1 "qevict cancel: $U" "$QEVICT" cancel r1 "$S"
expect_rpc "tenant set, dead port" 1 "qevict tenant set: $U" "$QEVICT" tenant set acme --quota 8G \
  --max-request-budget 1G --default-policy qevict --default-budget 0.25 --rotate-key "$S"
expect_rpc "tenant set --max-request-budget 0 (the quota)" 1 "qevict tenant set: $U" "$QEVICT" \
  tenant set acme --quota 8G --max-request-budget 0 "$S"
expect_rpc "tenant get, dead port" 1 "qevict tenant get: $U" "$QEVICT" tenant get acme "$S"
expect_rpc "tenant list, dead port" 1 "qevict tenant list: $U" "$QEVICT" tenant list --json "$S"
expect_rpc "tenant delete, dead port" 1 "qevict tenant delete: $U" "$QEVICT" tenant delete acme --force "$S"
expect_rpc "requests, dead port" 1 "qevict requests: $U" "$QEVICT" requests --tenant acme \
  --state running,queued --state finished --limit 10 "$S"
expect_rpc "drain, dead port" 1 "qevict drain: $U" "$QEVICT" drain g0 "$S"
expect_rpc "dead unix socket" 1 "qevict requests: $U" "$QEVICT" requests --server "unix:$TMP/absent.sock"
echo "k1" >"$TMP/admin.key"
QEVICT_SERVER="127.0.0.1:$DEAD" expect_rpc "\$QEVICT_SERVER" 1 "127.0.0.1:$DEAD" \
  "$QEVICT" drain --admin-key-file "$TMP/admin.key"
QEVICT_ADMIN_KEY="adm" expect_rpc "\$QEVICT_ADMIN_KEY" 1 "$U" "$QEVICT" drain "$S"

# A peer that accepts connections and never answers: deadlines and SIGINT.
python3 - "$TMP/bh.port" "$TMP/bh.accepted" <<'PY' &
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(64)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held, n = [], 0
s.settimeout(1.0)
end = time.time() + 300
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    held.append(c)
    n += 1
    open(sys.argv[2], "w").write(str(n))
PY
BH_PID=$!
for _ in $(seq 100); do [[ -f "$TMP/bh.port" ]] && break; sleep 0.1; done
[[ -f "$TMP/bh.port" ]] || { bad "black-hole listener did not start"; exit 1; }
BH="--server=127.0.0.1:$(cat "$TMP/bh.port")"
expect_rpc "unary deadline" 1 "qevict tenant list: DEADLINE_EXCEEDED" "$QEVICT" tenant list --timeout 1 "$BH"
expect_rpc "stream deadline" 1 "qevict submit: DEADLINE_EXCEEDED" "$QEVICT" submit --prompt hi --timeout 1 "$BH"

# interrupt DESCRIPTION NEEDLE CMD...: starts CMD, waits until it has connected to the peer,
# sends SIGINT; expects exit 130 and the command's own message (not death by the signal).
interrupt() {
  local what="$1" needle="$2"; shift 2
  rm -f "$TMP/bh.accepted"
  "$@" >"$TMP/out" 2>"$TMP/err" &
  local pid=$!
  for _ in $(seq 200); do [[ -f "$TMP/bh.accepted" ]] && break; sleep 0.05; done
  [[ -f "$TMP/bh.accepted" ]] || bad "$what: never connected"
  kill -INT "$pid"
  wait "$pid"
  local rc=$?
  [[ $rc -eq 130 ]] || bad "$what: exit $rc, expected 130"
  grep -qF -- "$needle" "$TMP/err" || bad "$what: stderr lacks '$needle': $(cat "$TMP/err")"
  echo "ok ($rc) $what: $(head -1 "$TMP/err")" >&2
}
interrupt "SIGINT during submit" "qevict submit: interrupted" "$QEVICT" submit --prompt hi "$BH"
interrupt "SIGINT during watch" "request r7 keeps running" "$QEVICT" watch r7 "$BH"
interrupt "SIGINT during a unary call" "qevict drain: interrupted" "$QEVICT" drain "$BH"

[[ $fail -eq 0 ]] && echo "all client checks passed" >&2
exit $fail
