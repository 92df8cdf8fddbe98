#!/usr/bin/env bash
# test_deploy: the systemd units of deploy/systemd pass `systemd-analyze verify` (their
# ExecStart pointed at the binaries of this build), and the daemons answer --help under their
# installed names; the workers' TP socket lies in the runtime directory their units share. usage: test_deploy.sh QEVICT_SCHED QEVICTD   (exit 77 = skipped)
set -uo pipefail
SCHED=$(readlink -f "$1")
WRK=$(readlink -f "$2")
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze absent" >&2; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
for u in qevict-sched.service qevictd@.service; do
  sed "s#/usr/local/bin/qevict-sched#$SCHED#; s#/usr/local/bin/qevictd#$WRK#" \
    "$ROOT/deploy/systemd/$u" >"$TMP/$u"
done
cp "$TMP/qevictd@.service" "$TMP/qevictd@0.service"
if out=$(systemd-analyze verify "$TMP/qevict-sched.service" "$TMP/qevictd@0.service" 2>&1); then
  echo "ok systemd-analyze verify: ${out:-clean}"
else
  echo "FAIL systemd-analyze verify: $out"; fail=1
fi
[[ -z "$out" ]] || { echo "FAIL: verify printed warnings"; fail=1; }
# a group's ranks meet on a socket in the runtime directory the worker units share (the qevict
# user can make it there; directly in /run, root's, it could not: a TP group crash-looped)
U="$ROOT/deploy/systemd/qevictd@.service"
rt=$(sed -n 's/^RuntimeDirectory=//p' "$U")
tp=$(grep -o -- '--tp-addr [^ ]*' "$U" | cut -d' ' -f2)
[[ -n $rt && $rt != *%* && $tp == "/run/$rt/"* ]] && grep -q '^RuntimeDirectoryPreserve=yes' "$U" &&
  echo "ok the TP socket $tp is in the shared runtime directory /run/$rt" ||
  { echo "FAIL: the TP socket '$tp' is not in a shared runtime directory ('$rt')"; fail=1; }
"$SCHED" --help | grep -q "qevict sched" || { echo "FAIL: qevict-sched --help"; fail=1; }
"$WRK" --help | grep -q "qevict worker" || { echo "FAIL: qevictd --help"; fail=1; }
"$WRK" --model /nonexistent 2>"$TMP/err"; rc=$?
[[ $rc -eq 2 ]] && grep -q "model" "$TMP/err" || { echo "FAIL: qevictd bad --model: rc $rc"; fail=1; }
exit $fail
