# call 4 (2026-12-05, twenty-third session, H200): long_ctx QEvict 20% steps 6-8 by kernel
export PACK=carry/pack; source bench/device_unpack.sh
bash bench/lc_ncu_steps.sh qevict $OUT; gzip $OUT/ncu_qevict.csv
