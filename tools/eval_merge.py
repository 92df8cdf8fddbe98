#!/usr/bin/python3
"""eval_merge: one markdown summary (and a PNG) over several `qevict eval --json` files, e.g. one
per prompt length, as bench/eval_gpu.sh writes them.

    tools/eval_merge.py OUT.md [PLOT.png] RESULTS.json...

Files of one length (shards of samples, `--first-sample`) are joined: counts summed, means
weighted by the samples behind them (`join`).

Tables: FullKV per task and length; per policy x budget and length, the accuracy averaged over
the tasks FullKV solves there (compared samples only) and the number of compared samples; the
perplexity KL from FullKV per length; and, at 5% and 10%, qevict against the best of the other
policies at the same bytes. The PNG (matplotlib, Debian python3-matplotlib) draws accuracy and
KL against the budget, one panel per length.
"""
import json
import sys


def rows(j, **kw):
    return [r for r in j["table"] if all(r.get(k) == v for k, v in kw.items())]


def load(paths):
    """(length, results) per length; shards of one length (--first-sample) become one."""
    by_len = {}
    for p in paths:
        j = json.load(open(p))
        L = j["config"]["lengths"][0]
        by_len[L] = join(by_len[L], j) if L in by_len else j
    return sorted(by_len.items(), key=lambda x: x[0])


def wmean(x, n, y, m):
    """The mean of x over n samples and y over m (either None or weightless: the other)."""
    if y is None or not m:
        return x
    if x is None or not n:
        return y
    return (x * n + y * m) / (n + m)


def left_out(r, k):
    """The values of k's mean left out: not finite (+inf, NaN) or undefined on their runs."""
    return sum((r.get("left_out") or {}).get(k, {}).values())


def compared(r, k):
    return (r.get("compared") or 0) - left_out(r, k)


def clean_runs(r, k):
    return (r.get("runs") or 0) - (r.get("errors") or 0) - left_out(r, k)


def join_left_out(q, r):
    """r's counts of values left out added to q's (those of the means joined)."""
    lq = q.setdefault("left_out", {})
    for k in UNJOINED:
        lq.pop(k, None)
    for k, c in (r.get("left_out") or {}).items():
        if k in UNJOINED:
            continue
        for why, n in c.items():
            lq.setdefault(k, {}).setdefault(why, 0)
            lq[k][why] += n


MEANS = ((("mean_score", "accuracy"), compared), (("kl", "ppl", "top1"), clean_runs))
UNJOINED = ("fmm", "churn", "global_lir", "ttr_median", "qsa", "int2_mass_ratio", "promotions",
            "agreement", "bytes_over_budget")


def join(a, b):
    """b's table rows folded into a's: counts summed; the accuracy and mean score weighted by
    the compared samples, perplexity, KL and top-1 agreement by the runs without an error (means
    over both shards' samples), less the values each mean left out (left_out, summed); the
    diagnostics' means, which these tables do not use, dropped."""
    keys = ("task", "length", "policy", "budget")
    at = {tuple(r.get(k) for k in keys): r for r in a["table"]}
    for r in b["table"]:
        q = at.get(tuple(r.get(k) for k in keys))
        if q is None:
            a["table"].append(r)
            continue
        for fields, weight in MEANS:
            for k in fields:
                q[k] = wmean(q.get(k), weight(q, k), r.get(k), weight(r, k))
        join_left_out(q, r)
        for k in UNJOINED:
            q.pop(k, None)
        for k in ("runs", "passed", "compared", "errors"):
            if isinstance(q.get(k), int) and isinstance(r.get(k), int):
                q[k] += r[k]
    return a


def cell(j, length, pol, budget, key):
    """Mean of key over the generation tasks compared at this length (None when none)."""
    vals, n = [], 0
    for r in rows(j, length=length, policy=pol):
        if r["task"] == "ppl" or abs(r["budget"] - budget) > 1e-9 or not r.get("compared"):
            continue
        if r.get(key) is not None:
            vals.append(r[key])
            n += r["compared"]
    return (sum(vals) / len(vals), n) if vals else (None, 0)


def ppl_row(j, length, pol, budget):
    v = [r for r in rows(j, task="ppl", length=length, policy=pol) if abs(r["budget"] - budget) < 1e-9]
    return v[0] if v else {}


def ppl_kl(j, length, pol, budget):
    return ppl_row(j, length, pol, budget).get("kl")


def kl_cell(j, length, pol, budget):
    """The KL as the table shows it, with the values its mean left out (as qevict eval does)."""
    lo = (ppl_row(j, length, pol, budget).get("left_out") or {}).get("kl", {})
    why = ", ".join("%d %s" % (n, {"nan": "NaN"}.get(w, w)) for w, n in sorted(lo.items()) if n)
    return fmt(ppl_kl(j, length, pol, budget), 4) + (" (%s left out)" % why if why else "")


def policies(j):
    return ["full"] + [v["label"] for v in j["config"]["policies"]]


def fmt(x, d=3):
    return "n/a" if x is None else ("%.*f" % (d, x))


def main():
    out = sys.argv[1]
    plot = sys.argv[2] if sys.argv[2].endswith(".png") else None
    data = load(sys.argv[3:] if plot else sys.argv[2:])
    lengths = [L for L, _ in data]
    budgets = data[0][1]["config"]["budgets"]
    pols = policies(data[0][1])
    md = []
    md.append("FullKV passed / samples, per task and length:\n")
    tasks = [t["name"] for t in data[0][1]["config"]["tasks"] if t["name"] != "ppl"]
    md.append("| task | " + " | ".join("%d" % L for L in lengths) + " |")
    md.append("|---|" + "---|" * len(lengths))
    for t in tasks:
        cells = []
        for L, j in data:
            r = rows(j, task=t, length=L, policy="full")
            cells.append("%d / %d" % (r[0]["passed"], r[0]["runs"]) if r else "n/a")
        md.append("| %s | %s |" % (t, " | ".join(cells)))
    md.append("\nAccuracy on the samples FullKV solves (mean over the tasks compared at that length; "
              "compared samples in brackets), and perplexity KL(FullKV || policy):\n")
    md.append("| policy | budget | " + " | ".join("acc %d" % L for L in lengths) + " | " +
              " | ".join("KL %d" % L for L in lengths) + " |")
    md.append("|---|---|" + "---|" * (2 * len(lengths)))
    for p in pols[1:]:
        for b in budgets:
            acc = []
            for L, j in data:
                a, n = cell(j, L, p, b, "mean_score")
                acc.append("%s (%d)" % (fmt(a, 2), n))
            kl = [kl_cell(j, L, p, b) for L, j in data]
            md.append("| %s | %d%% | %s | %s |" % (p, round(100 * b), " | ".join(acc), " | ".join(kl)))
    md.append("\nAt 5% and 10%: qevict against the best other policy at the same bytes "
              "(accuracy; KL, lower is better):\n")
    md.append("| length | budget | qevict acc | best other acc | qevict KL | best other KL |")
    md.append("|---|---|---|---|---|---|")
    for L, j in data:
        for b in (0.05, 0.1):
            if not any(abs(b - x) < 1e-9 for x in budgets):
                continue
            q = cell(j, L, "qevict", b, "mean_score")[0]
            others = [(cell(j, L, p, b, "mean_score")[0], p) for p in pols[1:] if p != "qevict"]
            others = [o for o in others if o[0] is not None]
            ba = max(others) if others else (None, "-")
            qk = ppl_kl(j, L, "qevict", b)
            ok = [(ppl_kl(j, L, p, b), p) for p in pols[1:] if p != "qevict"]
            ok = [o for o in ok if o[0] is not None]
            bk = min(ok) if ok else (None, "-")
            md.append("| %d | %d%% | %s | %s (%s) | %s | %s (%s) |" % (
                L, round(100 * b), fmt(q, 2), fmt(ba[0], 2), ba[1], fmt(qk, 4), fmt(bk[0], 4), bk[1]))
    open(out, "w").write("\n".join(md) + "\n")
    if plot:
        draw(plot, data, pols[1:], budgets)


def draw(path, data, pols, budgets):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, len(data), figsize=(4 * len(data), 6.5), squeeze=False)
    for c, (L, j) in enumerate(data):
        for p in pols:
            acc = [cell(j, L, p, b, "mean_score")[0] for b in budgets]
            kl = [ppl_kl(j, L, p, b) for b in budgets]
            xs = [100 * b for b in budgets]
            ax[0][c].plot(xs, [a if a is not None else float("nan") for a in acc], marker="o", label=p)
            ax[1][c].plot(xs, [k if k is not None else float("nan") for k in kl], marker="o", label=p)
        ax[0][c].set_title("%d tokens" % L)
        ax[0][c].set_ylim(-0.05, 1.05)
        ax[0][c].set_ylabel("accuracy (FullKV = 1)")
        ax[1][c].set_ylabel("KL(FullKV || policy)")
        ax[1][c].set_xlabel("KV budget, % of FullKV bytes")
        for a in (ax[0][c], ax[1][c]):
            a.set_xscale("log")
            a.minorticks_off()
            a.set_xticks([100 * b for b in budgets])
            a.set_xticklabels(["%g" % (100 * b) for b in budgets])
    ax[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


main()
