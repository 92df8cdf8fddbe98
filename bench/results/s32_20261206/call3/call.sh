# Thirty-second session (2026-12-06), call 3: call 2 without its last step (long_ctx_base), for
# the device time left. Carry carry/pack (call 1's). On an H200 only.
STEPS="lc peer" exec bash bench/results/s32_20261206/call2/call.sh
