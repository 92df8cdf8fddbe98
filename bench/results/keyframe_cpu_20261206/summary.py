#!/usr/bin/python3
"""Paired per-window comparison of qevict (post-RoPE INT2 keys, keyframe=abs) and
qevict:keyframe=pos (pre-RoPE) from this directory's eval JSON files.
Usage: summary.py [FILE.json ...]  (default: every kf_*.json here); prints markdown."""
import glob, json, math, os, sys
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
files = sys.argv[1:] or sorted(glob.glob(os.path.join(here, "kf_*.json")))
POST, PRE = "qevict", "qevict:keyframe=pos"
cells = defaultdict(dict)  # (length, budget) -> {(file, seed, sample): {policy: run}}
for f in files:
    d = json.load(open(f))
    seed = d["config"]["seed"]
    for r in d["runs"]:
        if r["task"] != "ppl" or r["policy"] not in (POST, PRE):
            continue
        key = (r["length"], r["budget"])
        cells[key].setdefault((os.path.basename(f), seed, r["sample"]), {})[r["policy"]] = r

def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")

print("| length | budget | windows | mean KL pre-RoPE | mean KL post-RoPE | post/pre "
      "| post-RoPE KL lower | top-1 pre-RoPE | top-1 post-RoPE |")
print("|---|---|---|---|---|---|---|---|---|")
tot_lower = tot_n = tot_ties = 0
logs = []  # log(post KL / pre KL) per pair
for (L, b) in sorted(cells):
    pairs = [w for w in cells[(L, b)].values() if PRE in w and POST in w]
    pre = [w[PRE]["kl"] for w in pairs]
    post = [w[POST]["kl"] for w in pairs]
    lower = sum(1 for a, c in zip(pre, post) if c < a)
    logs += [math.log(c / a) for a, c in zip(pre, post) if a > 0 and c > 0]
    tot_ties += sum(1 for a, c in zip(pre, post) if c == a)
    tot_lower += lower
    tot_n += len(pairs)
    t_pre = mean([w[PRE]["top1"] for w in pairs])
    t_post = mean([w[POST]["top1"] for w in pairs])
    print(f"| {L} | {b:.0%} | {len(pairs)} | {mean(pre):.4f} | {mean(post):.4f} "
          f"| {mean(post) / mean(pre):.2f} | {lower} of {len(pairs)} | {t_pre:.3f} | {t_post:.3f} |")
# two-sided sign test over the pairs that differ (ties left out)
from math import comb
n = tot_n - tot_ties
k = min(tot_lower, n - tot_lower)
p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else float("nan")
print(f"\nPost-RoPE KL lower in {tot_lower} of {tot_n} (window, budget) pairs "
      f"({tot_ties} ties; two-sided sign test p = {p:.3g}; pairs at one window's three budgets are not independent).")
logs.sort()
if logs:
    print(f"Per-pair KL ratio post/pre over {len(logs)} pairs: geometric mean "
          f"{math.exp(sum(logs) / len(logs)):.3f}, median {math.exp(logs[len(logs) // 2]):.3f}, "
          f"range {math.exp(logs[0]):.2f}-{math.exp(logs[-1]):.2f}.")
if "-v" in os.environ.get("SUMMARY_FLAGS", ""):
    for (L, b) in sorted(cells):
        for k, w in sorted(cells[(L, b)].items()):
            print(L, b, k, w[PRE]["kl"], w[POST]["kl"])
