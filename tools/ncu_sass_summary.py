#!/usr/bin/env python3
"""ncu_sass_summary.py: instruction mix and stall reasons of one kernel from an Nsight Compute
source-page CSV (`ncu --page source --print-source sass --csv ...`, as bench/gpu_attn_ab.sh
writes it). Usage: python3 tools/ncu_sass_summary.py FILE.csv"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_sass_lines import opcode, read_page  # noqa: E402

hdr, ix, rows, stall_cols = read_page(sys.argv[1])
tot = samp = 0
byop, sampop, stalls = collections.Counter(), collections.Counter(), collections.Counter()
for r in rows:
    n = int(r[ix["Instructions Executed"]] or 0)
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    src = r[ix["Source"]].strip()
    op = opcode(src) if src else "?"
    byop[op] += n
    sampop[op] += s
    tot += n
    samp += s
    for h in stall_cols:
        stalls[h] += int(r[ix[h]] or 0)
print("total warp instr", tot, "samples", samp)
for op, n in byop.most_common(30):
    print(f"{op:10s} {n:12d} {n/tot:6.3f}  samples {sampop[op]/samp:6.3f}")
print("stalls:")
st = sum(stalls.values())
for h, n in stalls.most_common(12):
    print(f"  {h:25s} {n/st:6.3f}")
