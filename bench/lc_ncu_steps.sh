#!/usr/bin/env bash
# lc_ncu_steps.sh: long_ctx's decode steps 6-8 (step 7 routes) at 32K, POLICY at a 20% budget,
# by kernel: ncu's gpu__time_duration of every launch (CUDA graph nodes included) into
# DIR/ncu_POLICY.csv, summed by tools/ncu_kernel_times.py into DIR/kernels_POLICY.txt, whose
# first and last lines it prints. On the device, with long_ctx on PATH (bench/device_unpack.sh).
# Usage: bash bench/lc_ncu_steps.sh POLICY DIR   (used by gpu_longctx_profile.sh, gpu_longctx_ab.sh)
pol=$1 dir=$2
QE_LC_PROFILE=6:8 timeout 420 ncu --profile-from-start off --clock-control none \
  --metrics gpu__time_duration.sum --csv long_ctx --policy "$pol" --budget 0.2 --ctx 32768 \
  --new 10 > "$dir/ncu_$pol.csv" 2> "$dir/ncu_$pol.err"
echo "ncu long_ctx $pol rc $?"
python3 "$(dirname "$0")/../tools/ncu_kernel_times.py" "$dir/ncu_$pol.csv" 3 > "$dir/kernels_$pol.txt"
head -24 "$dir/kernels_$pol.txt"
tail -1 "$dir/kernels_$pol.txt"
