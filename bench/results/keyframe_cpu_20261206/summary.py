#!/usr/bin/python3
"""Paired per-window comparison of each policy's post-RoPE INT2 keys (POLICY, keyframe=abs,
the default) and its pre-RoPE keys (POLICY:keyframe=pos) from this directory's eval JSON files:
qevict from kf_*.json, kivi from kivi_*.json.
Usage: summary.py [FILE.json ...]  (default: kf_*.json and kivi_*.json here); prints markdown,
one table per policy that has pairs."""
import glob, json, math, os, sys
from collections import defaultdict
from math import comb

here = os.path.dirname(os.path.abspath(__file__))
files = sys.argv[1:] or (sorted(glob.glob(os.path.join(here, "kf_*.json"))) +
                         sorted(glob.glob(os.path.join(here, "kivi_*.json"))))
BASES = ("qevict", "kivi")
# base -> (length, budget) -> {(file, seed, sample): {"post"|"pre": run}}
cells = {b: defaultdict(dict) for b in BASES}
for f in files:
    d = json.load(open(f))
    seed = d["config"]["seed"]
    for r in d["runs"]:
        if r["task"] != "ppl":
            continue
        for base in BASES:
            frame = {base: "post", base + ":keyframe=pos": "pre"}.get(r["policy"])
            if frame:
                key = (r["length"], r["budget"])
                win = (os.path.basename(f), seed, r["sample"])
                cells[base][key].setdefault(win, {})[frame] = r

def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")

first = True
for base in BASES:
    cb = cells[base]
    if not any("pre" in w and "post" in w for c in cb.values() for w in c.values()):
        continue
    if not first:
        print()
    first = False
    print(f"{base} (post-RoPE `{base}` against pre-RoPE `{base}:keyframe=pos`):\n")
    print("| length | budget | windows | mean KL pre-RoPE | mean KL post-RoPE | post/pre "
          "| post-RoPE KL lower | top-1 pre-RoPE | top-1 post-RoPE |")
    print("|---|---|---|---|---|---|---|---|---|")
    tot_lower = tot_n = tot_ties = 0
    nbudgets = len({b for (_, b) in cb})
    logs = []  # log(post KL / pre KL) per pair
    for (L, b) in sorted(cb):
        pairs = [w for w in cb[(L, b)].values() if "pre" in w and "post" in w]
        pre = [w["pre"]["kl"] for w in pairs]
        post = [w["post"]["kl"] for w in pairs]
        lower = sum(1 for a, c in zip(pre, post) if c < a)
        logs += [math.log(c / a) for a, c in zip(pre, post) if a > 0 and c > 0]
        tot_ties += sum(1 for a, c in zip(pre, post) if c == a)
        tot_lower += lower
        tot_n += len(pairs)
        t_pre = mean([w["pre"]["top1"] for w in pairs])
        t_post = mean([w["post"]["top1"] for w in pairs])
        print(f"| {L} | {b:.0%} | {len(pairs)} | {mean(pre):.4f} | {mean(post):.4f} "
              f"| {mean(post) / mean(pre):.2f} | {lower} of {len(pairs)} "
              f"| {t_pre:.3f} | {t_post:.3f} |")
    # two-sided sign test over the pairs that differ (ties left out)
    n = tot_n - tot_ties
    k = min(tot_lower, n - tot_lower)
    p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else float("nan")
    nb = {2: "two", 3: "three"}.get(nbudgets, str(nbudgets))
    print(f"\nPost-RoPE KL lower in {tot_lower} of {tot_n} (window, budget) pairs "
          f"({tot_ties} ties; two-sided sign test p = {p:.3g}; pairs at one window's {nb} "
          f"budgets are not independent).")
    logs.sort()
    if logs:
        print(f"Per-pair KL ratio post/pre over {len(logs)} pairs: geometric mean "
              f"{math.exp(sum(logs) / len(logs)):.3f}, median {math.exp(logs[len(logs) // 2]):.3f}, "
              f"range {math.exp(logs[0]):.2f}-{math.exp(logs[-1]):.2f}.")
    if "-v" in os.environ.get("SUMMARY_FLAGS", ""):
        for (L, b) in sorted(cb):
            for k, w in sorted(cb[(L, b)].items()):
                if "pre" in w and "post" in w:
                    print(base, L, b, k, w["pre"]["kl"], w["post"]["kl"])
