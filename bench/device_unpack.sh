#!/usr/bin/env bash
# device_unpack.sh: on the device, unpacks carry/pack (bench/device_pack.sh) into $QE_DEV
# (default /tmp/qe): bin/ (qevict and its daemon names, long_ctx, the GPU tests) and lib/.
# Source it: it exports PATH and LD_LIBRARY_PATH. Returns non-zero when the pack is missing.
QE_DEV=${QE_DEV:-/tmp/qe}
PACK=${PACK:-carry/pack}
if [[ ! -f "$PACK/libs.tar.xz" ]]; then
  echo "device_unpack: no $PACK/libs.tar.xz" >&2
  return 1 2>/dev/null || exit 1
fi
# (sourced twice in one call, e.g. gpu_record.sh then gpu_graphs.sh: unpacked once)
if [[ ${QE_UNPACKED:-} != "$QE_DEV" ]]; then
  rm -rf "$QE_DEV/bin" # (a warm device keeps /tmp: no binary of an earlier call's pack is left)
  mkdir -p "$QE_DEV/bin"
  for f in "$PACK"/*.xz; do
    [[ $f == */libs.tar.xz ]] && continue
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
      "$f" "$QE_DEV/bin/$(basename "$f" .xz)"
  done
  chmod +x "$QE_DEV"/bin/*
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$PACK/libs.tar.xz" "$QE_DEV"
  export QE_UNPACKED=$QE_DEV
fi
ln -sf qevict "$QE_DEV/bin/qevictd"
ln -sf qevict "$QE_DEV/bin/qevict-sched"
LIBS="$QE_DEV/lib"
ldconfig -p | grep -q 'libssl.so.3 ' || LIBS="$LIBS:$QE_DEV/libssl"
export PATH="$QE_DEV/bin:/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$LIBS:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
