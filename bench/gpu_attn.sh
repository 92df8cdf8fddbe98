#!/bin/sh
# gpu_attn.sh: the decode-attention kernel over tiered paged KV on the GPU machine, in one call.
# Builds (meson, CUDA, no serving/BLAS), then runs and logs under $OUT:
#   check.log       attn_decode: GPU kernel vs the fp64 CPU reference (fresh random data)
#   bench.log       attn_decode --bench: copy bandwidth, FullKV B=32 S=1280 and B=8 S=32768, tiered
#                   20% at S=32768 (JSON lines, table)
#   memcheck.log    compute-sanitizer --tool memcheck on attn_decode --small
#   racecheck.log   compute-sanitizer --tool racecheck on attn_decode --small
#   peer.log        torch SDPA decode (cuDNN, flash) on the same shapes (carry/peers/peers.py)
#   peer_queued.log the same, timed from an idle GPU and queued (bench/sdpa_queued.py)
#   build.log, sass_regs.log (ptxas resource usage)
# and prints a final table: qevict vs torch SDPA, bandwidth fractions, tiered/full.
# Usage (repo root): sh bench/gpu_attn.sh            (OUT defaults to bench/out/gpu_attn)
#   SHAPES=SUBSTR[,SUBSTR...]: only those bench shapes (attn_decode --shapes).
#   X=PATH: use that attn_decode (e.g. carry/pack's, after bench/device_unpack.sh) instead of
#   building; the SASS summary is then left out.
set -u
OUT=${OUT:-$(pwd)/bench/out/gpu_attn}
B=${B:-build-gpu-attn}
PEERS=${PEERS:-carry/peers/peers.py}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv \
  > "$OUT/gpu.log" 2>&1
cat "$OUT/gpu.log"

X=${X:-}
if [ -n "$X" ]; then
  echo "== prebuilt: $X"
else
echo "== build"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dcuda=enabled -Dserving=disabled -Dblas=disabled -Dnative=false \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tests/kernels/attn_decode tests/kernels/attn_emu >> "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
nvcc -c -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas -v -Icommon -Ikernels \
  -Ikernels/cuda kernels/cuda/kern_cuda_attn.cu -o /tmp/kca_regs.o > "$OUT/sass_regs.log" 2>&1
grep -E "Used|spill" "$OUT/sass_regs.log" | sort | uniq -c | sort -rn | head -5
# the tiered bench's kernel (HD 128, INT2, NORM, omega 16): MUFU and local memory in its SASS
if command -v cuobjdump > /dev/null 2>&1; then
  cuobjdump --dump-sass --function '_Z16kca_chunk_kernelILi128ELi2ELb0ELb0EEv12kca_params_t' \
    /tmp/kca_regs.o > "$OUT/sass_int2.txt" 2>&1
  echo "sass int2 kernel: $(grep -cE '^ +/\*[0-9a-f]{4}\*/' "$OUT/sass_int2.txt") instructions," \
    "MUFU.SIN/COS $(grep -cE 'MUFU\.(SIN|COS)' "$OUT/sass_int2.txt")," \
    "LDL $(grep -c 'LDL' "$OUT/sass_int2.txt"), STL $(grep -c 'STL' "$OUT/sass_int2.txt")" |
    tee "$OUT/sass_int2_summary.log"
fi
X="$B/tests/kernels/attn_decode"
fi

echo "== check"
"$X" > "$OUT/check.log" 2>&1
check_rc=$?
grep -E "^(FAIL|attn_decode)" "$OUT/check.log"

echo "== bench"
"$X" --bench ${SHAPES:+--shapes "$SHAPES"} > "$OUT/bench.log" 2>&1
bench_rc=$?
tail -9 "$OUT/bench.log"

echo "== compute-sanitizer"
compute-sanitizer --tool memcheck --leak-check full "$X" --small > "$OUT/memcheck.log" 2>&1
mem_rc=$?
compute-sanitizer --tool racecheck "$X" --small > "$OUT/racecheck.log" 2>&1
race_rc=$?
tail -2 "$OUT/memcheck.log"
tail -2 "$OUT/racecheck.log"

echo "== peer (torch SDPA)"
: > "$OUT/peer.log"
if [ -f "$PEERS" ]; then
  python3 "$PEERS" sdpa-decode --batch 32 --seq 1280 >> "$OUT/peer.log" 2>&1
  python3 "$PEERS" sdpa-decode --batch 8 --seq 32768 >> "$OUT/peer.log" 2>&1
  # the same shapes timed both ways attn_decode --bench times qevict (idle and queued)
  python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > "$OUT/peer_queued.log" 2>&1
else
  echo "peers.py not found at $PEERS: no peer numbers" | tee -a "$OUT/peer.log"
fi
grep '"peer"' "$OUT/peer.log"

echo "== summary"
python3 - "$OUT" "$check_rc" "$bench_rc" "$mem_rc" "$race_rc" <<'EOF'
import json, sys
out, check_rc, bench_rc, mem_rc, race_rc = sys.argv[1], *map(int, sys.argv[2:])
def lines(name):
    try:
        for l in open(f"{out}/{name}"):
            l = l.strip()
            if l.startswith("{"):
                try: yield json.loads(l)
                except ValueError: pass
    except OSError:
        return
bench = list(lines("bench.log"))
copy = next((b["GBps_read_plus_write"] for b in bench if b.get("bench") == "copy"), None)
best, auto = {}, {}
for b in bench:
    if "ms" in b and b.get("bench") != "copy":
        n = b["bench"]
        if n not in best or b["ms"] < best[n]["ms"]: best[n] = b
        if b.get("auto"): auto[n] = b
peer = {}
for p in lines("peer.log"):
    if "ms" in p: peer[(p["peer"], p["batch"], p["seq"])] = p["ms"]
print(f"copy bandwidth (read + write): {copy} GB/s" if copy else "copy bandwidth: n/a")
print(f"{'shape':<30} {'auto ms':>9} {'best ms':>9} {'chunk':>6} {'GB/s':>8} {'of copy':>8} "
      f"{'cuDNN ms':>9} {'flash ms':>9} {'vs cuDNN':>9} {'vs flash':>9}")
shapes = [("full_b32_s1280", (32, 1280)), ("full_b32_s1280_hot", (32, 1280)),
          ("full_b8_s32768", (8, 32768)), ("tiered20_b8_s32768", (8, 32768)),
          ("tiered20_w8_b8_s32768", (8, 32768)), ("tiered20_w8_b32_s1280", (32, 1280)),
          ("abs_tiered20_b8_s32768", (8, 32768)), ("abs_tiered20_w8_b8_s32768", (8, 32768)),
          ("abs_tiered20_w8_b32_s1280", (32, 1280)), ("full_b32_s32768", (32, 32768)),
          ("abs_tiered20_w8_b32_s32768", (32, 32768))]
for n, shape in shapes:
    if n not in best: continue
    b, a = best[n], auto.get(n, best[n])
    cd = peer.get(("torch-sdpa-cudnn",) + shape); fl = peer.get(("torch-sdpa-flash",) + shape)
    r = lambda x: f"{b['ms'] / x:9.3f}" if x else f"{'n/a':>9}"
    f = lambda x: f"{x:9.4f}" if x else f"{'n/a':>9}"
    print(f"{n:<30} {a['ms']:9.4f} {b['ms']:9.4f} {b['chunk_win']:6d} {b['GBps']:8.1f} "
          f"{b['frac_copy_bw']:8.3f} {f(cd)} {f(fl)} {r(cd)} {r(fl)}")
for n, shape in shapes[:3] + shapes[-2:-1]:  # FullKV as the engine calls it (no masses)
    nm = best.get(n + "_no_masses")
    if not nm: continue
    cd = peer.get(("torch-sdpa-cudnn",) + shape)
    print(f"{n + ' no masses':<30} {nm['ms']:9.4f} {'':>9} {nm['chunk_win']:6d} {nm['GBps']:8.1f} "
          f"{nm['frac_copy_bw']:8.3f} " + (f"{cd:9.4f} {'':>9} {nm['ms'] / cd:9.3f}" if cd else ""))
for t, fn in [(p + t, f) for p in ("", "abs_") for t, f in
              [("tiered20_b8_s32768", "full_b8_s32768"), ("tiered20_w8_b8_s32768", "full_b8_s32768"),
               ("tiered20_w8_b32_s1280", "full_b32_s1280")]]:
    if t in best and fn in best:
        print(f"{t} / {fn}: {best[t]['ms'] / best[fn]['ms']:.3f}"
              + (" (target <= 0.35)" if "32768" in t else ""))
for t in ("tiered20_b8_s32768", "tiered20_w8_b8_s32768", "tiered20_w8_b32_s1280"):
    if t in best and "abs_" + t in best:
        print(f"abs_{t} / {t} (post-RoPE against pre-RoPE INT2 keys): "
              f"{best['abs_' + t]['ms'] / best[t]['ms']:.3f}")
# GPU time: each launch queued behind a held stream (attn_decode's ms_gpu, sdpa_queued's ms_gpu)
pq = {(p["peer"], p["batch"], p["seq"]): p for p in lines("peer_queued.log") if "ms_gpu" in p}
copy_gpu = next((b.get("GBps_gpu") for b in bench if b.get("bench") == "copy"), None)
if copy_gpu:
    print(f"GPU time (queued launches; copy {copy_gpu:.1f} GB/s queued):")
    print(f"{'shape':<30} {'gpu ms':>9} {'of copy':>8} {'cuDNN gpu':>10} {'vs cuDNN':>9} "
          f"{'/ full':>7}")
    for n, shape in shapes + [(s[0] + "_no_masses", s[1]) for s in shapes[:3] + shapes[-2:-1]]:
        a = auto.get(n) if not n.endswith("_no_masses") else best.get(n)
        if not a or "ms_gpu" not in a: continue
        cd = pq.get(("torch-sdpa-cudnn",) + shape, {}).get("ms_gpu")
        ref = auto.get("full_b32_s32768" if "b32_s32768" in n else
                       "full_b8_s32768" if "32768" in n else "full_b32_s1280", {}).get("ms_gpu")
        print(f"{n:<30} {a['ms_gpu']:9.4f} {a['frac_copy_bw_gpu']:8.3f} "
              + (f"{cd:10.4f} {a['ms_gpu'] / cd:9.3f} " if cd else f"{'n/a':>10} {'':>9} ")
              + (f"{a['ms_gpu'] / ref:7.3f}" if ref and "tiered" in n else ""))
    for p in pq.values():
        if not p.get("queue_ahead", True):
            print(f"note: {p['peer']} {p['batch']}x{p['seq']}: the host's enqueue took "
                  f"{p['host_enqueue_max_ms']:.3f} ms, the queue was not always ahead")
print(f"check rc {check_rc}, bench rc {bench_rc}, memcheck rc {mem_rc}, racecheck rc {race_rc}")
EOF
