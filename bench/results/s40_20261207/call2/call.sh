# Fortieth session (2026-12-07), call 2, on any card: call 1's checks on the session's last tree
# (the --pool-bytes N% split in serve, the memory cgroup's room, the page-sized smallest request),
# then a worker alone with --pool-bytes 60% on rand_gguf's model: its FullKV arena takes over half
# the free memory, so it must warn at its load that one policy configuration runs at a time.
# Carry carry/pack2 (as call 1's).
export PACK=carry/pack2
bash bench/results/s40_20261207/call1/call.sh
O=${OUT:-/tmp/out}/s40c2
mkdir -p "$O"
source bench/device_unpack.sh || exit 1
"$QE_DEV/bin/rand_gguf" "$O/rand.gguf" --ctx 4096 --heads 4 --kv 2 --layers 2
QEVICT_LOG=info timeout 15 "$QE_DEV/bin/qevict" worker --model "$O/rand.gguf" --device 0 \
  --pool-bytes 60% --scheduler "unix:$O/none.sock" >"$O/worker60.log" 2>&1
grep -E 'pool-bytes|arena' "$O/worker60.log" | head -4
if grep -q 'one policy configuration (FullKV, or one tiered policy and window) can run at a time' \
  "$O/worker60.log"; then echo "worker --pool-bytes 60%: warned: PASS"; else
  echo "worker --pool-bytes 60%: no warning: FAIL"; fi
echo "call 2 done at $SECONDS s"
