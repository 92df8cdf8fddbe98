#!/usr/bin/env bash
# gpu_peer_table.sh: the decode-attention table of issue 5's shapes (FullKV B=32 S=1280, B=8 32K,
# B=32 32K; tiered 20% w8 B=8 and B=32 32K) and torch SDPA cuDNN on the same FullKV shapes,
# queued the same way (bench/sdpa_queued.py), $ROUNDS rounds (2) alternating; logs and the two
# summaries (attn.txt: log, shape, chunks, GPU ms, fraction of the copy bandwidth; sdpa.txt) in
# $OUT. Usage (repo root, on the device, after the pack is unpacked): bash bench/gpu_peer_table.sh
cd "$(dirname "$0")/.." || exit 2
source bench/device_unpack.sh || exit 1
S=full_b32_s1280,full_b8_s32768,full_b32_s32768,abs_tiered20_w8_b8_s32768,abs_tiered20_w8_b32_s32768
for r in $(seq 1 "${ROUNDS:-2}"); do
  attn_decode --bench --shapes $S > "$OUT/attn_$r.log" 2>&1
  python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > "$OUT/sdpa_$r.log" 2>&1
done
python3 - "$OUT"/attn_*.log <<'PY' | tee "$OUT/attn.txt"
import json, sys
for f in sys.argv[1:]:
    for ln in open(f):
        if ln.startswith('{"bench"') and '"auto": false' not in ln:
            d = json.loads(ln)
            print(f.rsplit('/', 1)[1], d["bench"], d.get("chunks_per_seq", ""), d.get("ms_gpu"),
                  d.get("frac_copy_bw_gpu", ""))
PY
grep -h 'ms_gpu' "$OUT"/sdpa_*.log | tee "$OUT/sdpa.txt"
