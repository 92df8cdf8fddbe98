#!/usr/bin/env bash
# gpu_longctx_profile.sh: one device call that times long_ctx at 32K (QEvict 20% and FullKV, with
# the decode routing passes' GPU time) and then breaks three decode steps of each (steps 6-8:
# step 7 routes) into kernels with Nsight Compute (bench/lc_ncu_steps.sh). Logs tarred to
# $OUT/lcprof.tgz.
# The pack (here): long_ctx from the CUDA build, stripped and xz'd into carry/pack with
#   libs.tar.xz (bench/device_pack.sh's pack_libs).
# Usage (repo root, on the device): bash bench/gpu_longctx_profile.sh   (carry: carry/pack)
cd "$(dirname "$0")/.." || exit 2
source bench/device_unpack.sh || exit 1
L=$OUT/lcprof; mkdir -p "$L"
NEW=${NEW:-24}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$L/gpu.txt"
for pol in qevict full; do
  timeout 240 long_ctx --policy $pol --budget 0.2 --ctx 32768 --new "$NEW" \
    > "$L/lc_$pol.json" 2> "$L/lc_$pol.err"
  echo "long_ctx $pol rc $?: $(cut -c1-400 "$L/lc_$pol.json") $(tail -1 "$L/lc_$pol.err")"
done
for pol in qevict full; do bash bench/lc_ncu_steps.sh $pol "$L"; done
tar -C "$OUT" -czf "$OUT/lcprof.tgz" lcprof && rm -rf "$L"
