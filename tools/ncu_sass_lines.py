#!/usr/bin/env python3
"""ncu_sass_lines.py: an Nsight Compute SASS source page (ncu --page source --print-source sass
--csv) of one kernel joined with the line table of the same cubin (nvdisasm -gi), so that
instructions executed and stall samples add up by source line and by inlined call site.
Usage: [LO=a HI=b] [SUB="line ..."] [DUMP="top:sub ..."] [TOPSTALL=n] [NONE=1]
  ncu_sass_lines.py NCU.csv NVDISASM.txt KERNEL_SYMBOL [N_LINES]
LO..HI: the lines of the function whose call sites group the totals (the walk of the chunk
kernel); SUB: the call sites inside those lines; DUMP: the instructions of one inner call site;
TOPSTALL: the n instructions with most stall samples; NONE: what falls outside LO..HI."""
import csv, sys, re, collections, os
LO=int(os.environ.get("LO","1745")); HI=int(os.environ.get("HI","1815"))
sass_csv, dis, fn = sys.argv[1], sys.argv[2], sys.argv[3]
# parse nvdisasm -gi: find function section, map offset -> (file:line chain)
lines = open(dis).read().splitlines()
start = None
for i,l in enumerate(lines):
    if re.match(r'\s*\.text\.'+re.escape(fn)+':', l) or l.strip()==fn+':':
        start = i; break
assert start is not None, "fn not found"
cur = None; m = {}; ops = {}; incom = False
for l in lines[start+1:]:
    if l.strip().startswith('.section'): break
    g = re.search(r'//## File "([^"]+)", line (\d+)(.*)', l)
    if g:
        if not incom: cur = []
        incom = True
        cur.append((g.group(1).split('/')[-1], int(g.group(2))))
        continue
    o = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if o: incom = False
    if o and cur is not None:
        off = int(o.group(1),16); m[off] = cur; ops[off] = o.group(2)
rows = open(sass_csv).read().splitlines()
i = next(k for k,l in enumerate(rows) if l.startswith('"Address"'))
R = list(csv.reader(rows[i:])); hdr = R[0]; ix = {h:k for k,h in enumerate(hdr)}
base = int(R[1][0],16)
byline = collections.Counter(); bys = collections.Counter(); byfn = collections.Counter(); byfs = collections.Counter()
tot = 0; ts = 0; mism = 0
for r in R[1:]:
    if len(r) < len(hdr): continue
    off = int(r[0],16) - base
    n = int(r[ix["Instructions Executed"]] or 0); s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    tot += n; ts += s
    ch = m.get(off)
    if ch is None: byline["?"] += n; continue
    a = re.sub(r'^@!?U?P\w+\s+','',r[1].strip()).split()[0]; b = re.sub(r'^@!?U?P\w+\s+','',ops[off]).split()[0]
    if a.split('.')[0] != b.split('.')[0]: mism += 1
    key = f"{ch[0][0]}:{ch[0][1]}"
    byline[key] += n; bys[key] += s
    # attribute to the outermost call site in the chunk body (line in dev.cuh within kca_chunk_body 1733-1800)
    top = None
    for f,ln in ch:
        if f.endswith("dev.cuh") and LO <= ln <= HI: top = ln
    byfn[top] += n; byfs[top] += s
print("total", tot, "samples", ts, "mismatched ops", mism)
print("--- by innermost line")
for k,n in byline.most_common(int(sys.argv[4]) if len(sys.argv)>4 else 40): print(f"{k:28s} {n:10d} {n/tot:6.3f} samp {bys[k]/ts:6.3f}")
print("--- by chunk-body call site")
for k,n in sorted(byfn.items(), key=lambda x:-x[1]): print(f"{str(k):8s} {n:10d} {n/tot:6.3f} samp {byfs[k]/ts:6.3f}")
# second-level: for a given top call site, the frame just inside it
def sub(topline, depth=1):
    c = collections.Counter(); cs = collections.Counter()
    for r in R[1:]:
        if len(r) < len(hdr): continue
        off = int(r[0],16) - base
        ch = m.get(off)
        if not ch: continue
        idx = [k for k,(f,ln) in enumerate(ch) if f.endswith("dev.cuh") and ln == topline]
        if not idx: continue
        k = idx[-1]
        key = ch[k-depth][1] if k-depth >= 0 else 'self'
        c[key] += int(r[ix["Instructions Executed"]] or 0); cs[key] += int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    print(f"--- inside line {topline}")
    for k,n in c.most_common(25): print(f"  {str(k):6s} {n:10d} {n/tot:6.3f} samp {cs[k]/ts:6.3f}")
import os
for t in os.environ.get("SUB","").split():
    sub(int(t))
def dump(topline, subline):
    for r in R[1:]:
        if len(r) < len(hdr): continue
        off = int(r[0],16) - base
        ch = m.get(off)
        if not ch: continue
        idx = [k for k,(f,ln) in enumerate(ch) if f.endswith("dev.cuh") and ln == topline]
        if not idx: continue
        k = idx[-1]
        if k-1 < 0 or ch[k-1][1] != subline: continue
        n = int(r[ix["Instructions Executed"]] or 0)
        if n == 0: continue
        print(f"{off:05x} {n:8d} s{int(r[ix['Warp Stall Sampling (All Samples)']] or 0):4d} {r[1].strip()[:60]:60s} {ch[0][1]}")
for t in os.environ.get("DUMP","").split():
    a,b = t.split(':'); print("=== dump", a, b); dump(int(a), int(b))
if os.environ.get("TOPSTALL"):
    rows2 = []
    for r in R[1:]:
        if len(r) < len(hdr): continue
        off = int(r[0],16) - base; ch = m.get(off) or [("?",0)]
        s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
        st = {h: int(r[ix[h]] or 0) for h in hdr if h.startswith('stall_') and 'Not Issued' not in h}
        top = max(st, key=st.get)
        rows2.append((s, off, r[1].strip()[:50], ch[0][1], [x[1] for x in ch[:4]], top))
    rows2.sort(reverse=True)
    for x in rows2[:int(os.environ["TOPSTALL"])]: print(f"{x[0]:5d} {x[1]:05x} {x[2]:50s} {x[4]} {x[5]}")
if os.environ.get("NONE"):
    c = collections.Counter(); cs = collections.Counter()
    for r in R[1:]:
        if len(r) < len(hdr): continue
        off = int(r[0],16) - base; ch = m.get(off)
        if not ch: continue
        if any(f.endswith("dev.cuh") and LO <= ln <= HI for f,ln in ch): continue
        key = " <- ".join(str(x[1]) for x in ch[:3])
        c[key] += int(r[ix["Instructions Executed"]] or 0); cs[key] += int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    for k,n in c.most_common(25): print(f"  {k:30s} {n:10d} {n/tot:6.3f} samp {cs[k]/ts:6.3f}")
