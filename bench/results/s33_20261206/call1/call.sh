# Thirty-third session (2026-12-06), call 1. Carry carry/pack (bench/device_pack.sh of the tree,
# less qevict and the tests not run here, plus long_ctx_base: -DKCA_L2HINT=0).
# On an H200 first the owed H200 steps (bench/results/s32_20261206/call2/call.sh, STEPS "lc"
# by default: the device time left was short); on any card
# then attn_block's swapped layout (SW: keys, then channels, as the mma rows, the heads as its
# columns): the check against the fp64 reference, then --bench (3 rounds) against the tree's
# kernel, and torch SDPA cuDNN queued alike in the same call.
export PACK=carry/pack
G=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "card: $G"
case "$G" in *H200*) STEPS="${H200_STEPS:-lc}" bash bench/results/s32_20261206/call2/call.sh ;; esac
source bench/device_unpack.sh || exit 1
attn_block > "$OUT/check.log" 2>&1
echo "check rc $?"; grep -c '^ok' "$OUT/check.log"; grep -E 'FAIL|failures' "$OUT/check.log" | tail -5
attn_block --bench --rounds "${ROUNDS:-3}" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $SECONDS s"
python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > "$OUT/sdpa.log" 2>&1
grep variant "$OUT/bench.log"
grep err_vs_tree "$OUT/bench.log" | sed 's/{"bench": //' | cut -c1-110
grep 'median' "$OUT/bench.log"
python3 - "$OUT/sdpa.log" <<'PY'
import json, sys
for ln in open(sys.argv[1]):
    if ln.startswith("{"):
        d = json.loads(ln)
        print(d["peer"], d["batch"], d["seq"], "ms_gpu", d.get("ms_gpu"), "ms", d.get("ms"))
PY
echo "done at $SECONDS s"
