#!/usr/bin/python3
"""eval_plots: PNG figures from the JSON of `qevict eval --json FILE`.

    tools/eval_plots.py RESULTS.json OUTDIR

Writes into OUTDIR (created if needed):
  quality_<task>.png   accuracy (generation tasks, on the samples FullKV solves) or perplexity
                       and KL from FullKV (ppl) against the KV budget, one line per policy,
                       FullKV as a dashed line; quality_average.png over the compared tasks;
  fmm_steps_<budget>.png  FMM (H = 32) of the routing events at each decode step, averaged over
                       the samples (the paper's Figure 1); for every policy with INT2 windows a
                       dotted line counts them as missed too (the "FP tier only" curve);
  fmm_budget.png       mean FMM against the budget, one line per policy.
Needs matplotlib (Debian: python3-matplotlib). Not run in CI.
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def finite(x):
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def policies(res):
    return [p["label"] for p in res["config"]["policies"]]


def cells(res, task, metric):
    """{policy: [(budget, value)]} over every length pooled, and FullKV's value."""
    out, full = {}, None
    for c in res["table"]:
        if c["task"] != task or c.get("length") is not None or not finite(c.get(metric)):
            continue
        if c["policy"] == "full":
            full = c[metric]
        else:
            out.setdefault(c["policy"], []).append((c["budget"], c[metric]))
    return out, full


def palette(n):
    """Distinct colours for n series (tab10, or tab20 beyond ten)."""
    return list(plt.cm.tab10.colors if n <= 10 else plt.cm.tab20.colors)


def plot_quality(res, task, metric, ylabel, path, logy=False):
    series, full = cells(res, task, metric)
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = palette(len(policies(res)))
    for k, p in enumerate(policies(res)):
        if p in series:
            pts = sorted(series[p])
            ax.plot([100 * b for b, _ in pts], [v for _, v in pts], marker="o", label=p,
                    color=colors[k % len(colors)])
    if finite(full):
        ax.axhline(full, color="black", linestyle="--", linewidth=1, label="FullKV")
    ax.set_xlabel("KV budget (% of FullKV bytes)")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.set_title(f"{task}: {res['config']['model']}")
    return save(fig, ax, path)


def save(fig, ax, path):
    """A grid and a legend on ax, fig saved to path and closed; True."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def step_means(runs, key):
    """Mean over runs of a per-step list, ignoring nulls; [(step, mean)]."""
    sums, counts = {}, {}
    for r in runs:
        for i, v in enumerate(r["diagnostics"].get(key) or []):
            if finite(v):
                sums[i] = sums.get(i, 0.0) + v
                counts[i] = counts.get(i, 0) + 1
    return [(i, sums[i] / counts[i]) for i in sorted(sums)]


def plot_fmm_steps(res, budget, path):
    runs = [r for r in res["runs"] if r["budget"] == budget and "diagnostics" in r and r["policy"] != "full"]
    if not runs:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = palette(len(policies(res)))
    for k, p in enumerate(policies(res)):
        rs = [r for r in runs if r["policy"] == p]
        pts = step_means(rs, "fmm_steps")
        if not pts:
            continue
        c = colors[k % len(colors)]
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", color=c, label=p)
        has_int2 = any((r.get("memory") or {}).get("windows_int2", 0) > 0 for r in rs)
        if has_int2:
            fp = step_means(rs, "fmm_fp_steps")
            ax.plot([s for s, _ in fp], [v for _, v in fp], linestyle=":", color=c,
                    label=f"{p} (INT2 as missed)")
    ax.set_xlabel("decode step (0 = after prefill)")
    ax.set_ylabel("FMM (H = 32)")
    ax.set_title(f"future missed mass at {100 * budget:g}% of FullKV bytes")
    return save(fig, ax, path)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: eval_plots.py RESULTS.json OUTDIR")
    res = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    written = []
    for t in [t["name"] for t in res["config"]["tasks"]] + ["average"]:
        if t == "ppl":
            for metric, label, logy in (("ppl", "perplexity", True), ("kl", "KL(FullKV || policy)", False)):
                p = os.path.join(out, f"quality_ppl_{metric}.png")
                if plot_quality(res, t, metric, label, p, logy):
                    written.append(p)
        else:
            p = os.path.join(out, f"quality_{t}.png")
            if plot_quality(res, t, "accuracy", "accuracy (samples FullKV solves)", p):
                written.append(p)
    p = os.path.join(out, "fmm_budget.png")
    if plot_quality(res, "average", "fmm", "mean FMM (H = 32)", p):
        written.append(p)
    for b in res["config"]["budgets"]:
        p = os.path.join(out, f"fmm_steps_{100 * b:g}pct.png")
        if plot_fmm_steps(res, b, p):
            written.append(p)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
