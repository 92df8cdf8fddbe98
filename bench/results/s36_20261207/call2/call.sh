# Thirty-sixth session (2026-12-07), call 2 (any card): the GPU checks of the tree as it is,
# among them attn_decode with the case table the thirty-fifth session compacted (it compiled
# then and never ran): attn_decode's checks against the fp64 reference, test_kv_gpu,
# test_kc_quant and test_kern_cuda, then compute-sanitizer memcheck of attn_decode --small.
# Carry carry/h100: libs.tar.xz of carry/pack plus those four binaries of build-srv-dev,
# stripped and xz-compressed. Logs under $OUT/logs; the last lines are a table.
export PACK=carry/h100
# shellcheck source=bench/device_unpack.sh
source bench/device_unpack.sh || exit 1
L=${OUT:-/tmp}/logs
mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee "$L/card.txt"
run() { # NAME CMD...
  local name=$1 t0=$SECONDS
  shift
  timeout 240 "$@" > "$L/$name.log" 2>&1
  local rc=$?
  printf '%-22s rc %3d  %3d s  FAIL lines %d  %s\n' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -c '^FAIL' "$L/$name.log")" "$(tail -1 "$L/$name.log" | cut -c1-70)" >> "$L/table.txt"
}
run attn_decode attn_decode
run test_kv_gpu test_kv_gpu
run test_kc_quant test_kc_quant
run test_kern_cuda test_kern_cuda
run memcheck_attn compute-sanitizer --tool memcheck attn_decode --small
cat "$L/table.txt"
echo "call done at $SECONDS s"
