#!/usr/bin/env python3
"""ncu_sass_summary.py: instruction mix and stall reasons of one kernel from an Nsight Compute
source-page CSV (`ncu --page source --print-source sass --csv ...`, as bench/gpu_attn_ab.sh
writes it). Usage: python3 tools/ncu_sass_summary.py FILE.csv"""
import csv, sys, collections, re
f = sys.argv[1]
lines = open(f).read().splitlines()
i = next(k for k,l in enumerate(lines) if l.startswith('"Address"'))
rows = list(csv.reader(lines[i:]))
hdr = rows[0]; rows = rows[1:]
ix = {h:k for k,h in enumerate(hdr)}
tot = 0; samp = 0
byop = collections.Counter(); sampop = collections.Counter()
stalls = collections.Counter()
for r in rows:
    if len(r) < len(hdr): continue
    n = int(r[ix["Instructions Executed"]] or 0); s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    src = r[ix["Source"]].strip()
    op = re.sub(r'^@!?U?P\w+\s+', '', src).split()[0] if src else '?'
    op = op.split('.')[0]
    byop[op] += n; sampop[op] += s; tot += n; samp += s
    for h in hdr:
        if h.startswith('stall_') and 'Not Issued' not in h:
            stalls[h] += int(r[ix[h]] or 0)
print("total warp instr", tot, "samples", samp)
for op, n in byop.most_common(30): print(f"{op:10s} {n:12d} {n/tot:6.3f}  samples {sampop[op]/samp:6.3f}")
print("stalls:")
st = sum(stalls.values())
for h, n in stalls.most_common(12): print(f"  {h:25s} {n/st:6.3f}")
