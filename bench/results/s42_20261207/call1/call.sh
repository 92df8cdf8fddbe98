# Forty-second session (2026-12-07), call 1: the owed H200 call (the thirty-fifth session's call 1,
# bench/results/s35_20261207/call1/call.sh: long_ctx at 32K QEvict 20% and FullKV, the peer table
# with torch SDPA cuDNN, long_ctx without the L2 prefetch; a second long_ctx round while time is
# left), then its files in one archive ($OUT holds 8 files at most). Carry carry/pack (see
# call2/call.sh; long_ctx_base: long_ctx built with NVCC_APPEND_FLAGS=-DKCA_L2HINT=0).
# On an H200 only (other cards stop at once).
bash bench/results/s35_20261207/call1/call.sh
O=${OUT:-/tmp/out}
cd "$O" && ls && tar -czf s42c1.tgz --exclude s42c1.tgz -- * && find . -mindepth 1 ! -name s42c1.tgz \
  ! -name attn.txt ! -name sdpa.txt -exec rm -rf {} +
