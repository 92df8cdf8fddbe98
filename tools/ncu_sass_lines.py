#!/usr/bin/env python3
"""ncu_sass_lines.py: an Nsight Compute SASS source page of one kernel (ncu --page source
--print-source sass --csv) joined with the line table of the same cubin (nvdisasm -gi), so that
instructions executed and stall samples add up by source line and by inlined call site.

Usage: [LO=a HI=b] [SRC=file] [SUB="line ..."] [DUMP="top:sub ..."] [TOPSTALL=n] [NONE=1]
         ncu_sass_lines.py NCU.csv NVDISASM.txt KERNEL_SYMBOL [N_LINES]
  SRC (default kern_cuda_attn_dev.cuh): the file whose lines LO..HI (a function's body, e.g. the
  chunk kernel's walk) group the totals by call site; SUB: the call sites one level inside
  those lines; DUMP: the instructions of one inner call site; TOPSTALL: the n instructions with
  the most stall samples; NONE: what falls outside LO..HI, by its innermost three frames."""
import collections
import csv
import os
import re
import sys

SRC = os.environ.get("SRC", "kern_cuda_attn_dev.cuh")
LO, HI = int(os.environ.get("LO", "1")), int(os.environ.get("HI", "1000000"))


def line_table(path, fn):
    """SASS offset -> inline chain [(file, line), ...], innermost first; and the opcodes."""
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == fn + ":")
    chains, ops, cur, in_comment = {}, {}, None, False
    for l in lines[start + 1:]:
        if l.strip().startswith(".section"):
            break
        g = re.search(r'//## File "([^"]+)", line (\d+)', l)
        if g:
            cur = cur if in_comment else []
            in_comment = True
            cur.append((g.group(1).split("/")[-1], int(g.group(2))))
            continue
        o = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
        if o:
            in_comment = False
            if cur is not None:
                chains[int(o.group(1), 16)], ops[int(o.group(1), 16)] = cur, o.group(2)
    return chains, ops


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()[0].split(".")[0]


def read_page(path):
    """The source page's header, column index, full rows, and stall-reason columns."""
    text = open(path).read().splitlines()
    i = next(k for k, l in enumerate(text) if l.startswith('"Address"'))
    rows = list(csv.reader(text[i:]))
    hdr, rows = rows[0], [r for r in rows[1:] if len(r) >= len(rows[0])]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    return hdr, {h: k for k, h in enumerate(hdr)}, rows, stalls


def sass_rows(path, chains, ops):
    """(offset, instructions, samples, chain, text, top stall reason) of every SASS row."""
    hdr, ix, rows, stalls = read_page(path)
    base = int(rows[0][0], 16)
    out, mismatched = [], 0
    for r in rows:
        off = int(r[0], 16) - base
        if off in ops and opcode(r[1]) != opcode(ops[off]):
            mismatched += 1
        top = max(stalls, key=lambda h: int(r[ix[h]] or 0))
        out.append((off, int(r[ix["Instructions Executed"]] or 0),
                    int(r[ix["Warp Stall Sampling (All Samples)"]] or 0), chains.get(off), r[1].strip(),
                    top))
    return out, mismatched


def site(chain):
    """Index in chain of the outermost frame in SRC's lines LO..HI (None: none)."""
    idx = [k for k, (f, ln) in enumerate(chain or []) if f == SRC and LO <= ln <= HI]
    return idx[-1] if idx else None


def table(title, counts, samples, tot, ts, n=40):
    print("---", title)
    for k, v in counts.most_common(n):
        print(f"  {str(k):30s} {v:10d} {v / tot:6.3f} samp {samples[k] / ts:6.3f}")


def main():
    chains, ops = line_table(sys.argv[2], sys.argv[3])
    rows, mismatched = sass_rows(sys.argv[1], chains, ops)
    tot, ts = sum(r[1] for r in rows), max(1, sum(r[2] for r in rows))
    print("total", tot, "samples", ts, "mismatched opcodes", mismatched)
    groups = {"by innermost line": lambda ch, k: f"{ch[0][0]}:{ch[0][1]}",
              "by call site in %s %d-%d" % (SRC, LO, HI): lambda ch, k: ch[k][1] if k is not None else None}
    for title, key in groups.items():
        c, s = collections.Counter(), collections.Counter()
        for off, n, smp, ch, _, _ in rows:
            if ch:
                c[key(ch, site(ch))] += n
                s[key(ch, site(ch))] += smp
        table(title, c, s, tot, ts, int(sys.argv[4]) if len(sys.argv) > 4 else 40)
    for t in os.environ.get("SUB", "").split():
        c, s = collections.Counter(), collections.Counter()
        for off, n, smp, ch, _, _ in rows:
            k = site(ch)
            if k is not None and ch[k][1] == int(t):
                c[ch[k - 1][1] if k > 0 else "self"] += n
                s[ch[k - 1][1] if k > 0 else "self"] += smp
        table("inside line " + t, c, s, tot, ts, 25)
    for t in os.environ.get("DUMP", "").split():
        top, sub = (int(x) for x in t.split(":"))
        print("=== dump", t)
        for off, n, smp, ch, text, _ in rows:
            k = site(ch)
            if n and k and ch[k][1] == top and ch[k - 1][1] == sub:
                print(f"{off:05x} {n:8d} s{smp:4d} {text[:60]:60s} {ch[0][1]}")
    if os.environ.get("TOPSTALL"):
        for off, n, smp, ch, text, top in sorted(rows, key=lambda r: -r[2])[:int(os.environ["TOPSTALL"])]:
            print(f"{smp:5d} {off:05x} {text[:50]:50s} {[x[1] for x in (ch or [])[:4]]} {top}")
    if os.environ.get("NONE"):
        c, s = collections.Counter(), collections.Counter()
        for off, n, smp, ch, _, _ in rows:
            if ch and site(ch) is None:
                key = " <- ".join(str(x[1]) for x in ch[:3])
                c[key] += n
                s[key] += smp
        table("outside the call sites", c, s, tot, ts, 25)


if __name__ == "__main__":
    main()
