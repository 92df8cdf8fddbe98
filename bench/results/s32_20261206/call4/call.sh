# Thirty-second session (2026-12-06), call 4: the least of the owed H200 figures, for the device
# time left: long_ctx at 32K, 200 new tokens, QEvict 20% then FullKV (the tokens/s target), the
# tree of 6145b0e (call 1's pack, carry carry/pack). On an H200 only.
STEPS=lc exec bash bench/results/s32_20261206/call2/call.sh
