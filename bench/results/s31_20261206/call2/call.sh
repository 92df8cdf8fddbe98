# Thirty-first session (2026-12-06), call 2: the H200 figures of the tree (7ad1ac0's GPU code: the
# wide rule and the 256-byte L2 prefetch as defaults). On an H200 only (other cards stop at once):
# long_ctx at 32K, 200 new tokens, QEvict 20% then FullKV; the decode-attention table (FullKV
# B=32 S=1280, B=8 32K, B=32 32K; tiered 20% w8 B=8 and B=32 32K) with torch SDPA cuDNN queued the
# same way, two rounds; then long_ctx QEvict of the -DKCA_L2HINT=0 build (long_ctx_base).
# Carry carry/pack (as call 1's, less attn_decode_base). Never run (no H200 was lent); the
# thirty-second session's call 2 runs the same steps (its script, which this one now calls).
exec bash bench/results/s32_20261206/call2/call.sh
