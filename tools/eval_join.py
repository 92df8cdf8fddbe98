#!/usr/bin/python3
"""eval_join: joins shards of one grid (`qevict eval --first-sample K --json`, run as separate
processes, e.g. by bench/eval_cpu_device.sh) into one list of runs, and tabulates it.

    tools/eval_join.py OUT SHARD.json...   (a SHARD may be an earlier OUT.json)

Writes OUT.json ({"shards": [their configs], "runs": [every run]}) and OUT.md, and prints the
markdown: per task, policy and budget, the samples FullKV solved (each shard runs FullKV on its
samples; a sample's FullKV runs must agree, else the join fails; shards of several seeds are
samples of their own) and the policy's mean score
over them; per policy and budget, the perplexity KL from FullKV. A shard that is not valid JSON
(stopped before it wrote its results) is named as missing."""
import json
import sys


def load(paths):
    """The shards, each run tagged with its shard's seed; and the paths that did not load."""
    shards, missing = [], []
    for p in paths:
        try:
            j = json.load(open(p))
        except (OSError, ValueError):
            missing.append(p)
            continue
        if "shards" in j:  # an earlier join: its runs carry their seeds
            j["config"] = j["shards"][0] if j["shards"] else {}
        for r in j["runs"]:
            r.setdefault("seed", j["config"].get("seed"))
        shards.append(j)
    return shards, missing


def full_runs(shards):
    """FullKV's run per (task, length, sample); SystemExit if two shards disagree."""
    full = {}
    for j in shards:
        for r in j["runs"]:
            if r["policy"] != "full":
                continue
            k = (r["task"], r["length"], r["seed"], r["sample"])
            same = {x: r.get(x) for x in ("score", "pass", "output", "ppl")}
            if k in full and full[k] != same:
                sys.exit("eval_join: FullKV differs between shards at %s" % (k,))
            full[k] = same
    return full


def policy_runs(shards):
    seen, out = set(), []
    for j in shards:
        for r in j["runs"]:
            k = (r["task"], r["length"], r["seed"], r["sample"], r["policy"], r["budget"])
            if r["policy"] != "full" and k not in seen:
                seen.add(k)
                out.append(r)
    return out


def table(full, runs):
    md = ["| task | length | policy | budget | FullKV solved | score (mean over solved) | KL |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    keys = sorted({(r["task"], r["length"], r["policy"], r["budget"]) for r in runs})
    for task, length, pol, b in keys:
        rs = [r for r in runs if (r["task"], r["length"], r["policy"], r["budget"]) == (task, length, pol, b)]
        if task == "ppl":
            # a KL that is not finite (null in the runs) is listed as n/a, not left out
            kl = ["n/a" if r["kl"] is None else "%.4f" % r["kl"] for r in rs if "kl" in r]
            md.append("| ppl | %d | %s | %g%% | - | - | %s |" % (
                length, pol, 100 * b, ", ".join(kl) or "n/a"))
            continue
        solved = [k for k, f in full.items() if k[0] == task and k[1] == length and f["pass"]]
        sc = [r["score"] for r in rs if r.get("compared") and "error" not in r]
        md.append("| %s | %d | %s | %g%% | %d of %d | %s | - |" % (
            task, length, pol, 100 * b, len(solved),
            len([k for k in full if k[0] == task and k[1] == length]),
            "%.2f (%d)" % (sum(sc) / len(sc), len(sc)) if sc else "n/a"))
    return md


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    shards, missing = load(paths)
    full = full_runs(shards)
    runs = policy_runs(shards)
    md = table(full, runs)
    if missing:
        md.append("\nMissing shards (no results): " + ", ".join(missing))
    fulls = {(r["task"], r["length"], r["seed"], r["sample"]): r
             for j in shards for r in j["runs"] if r["policy"] == "full"}
    configs = [c for j in shards for c in (j["shards"] if "shards" in j else [j["config"]])]
    json.dump({"shards": configs, "missing": missing,
               "runs": list(fulls.values()) + runs}, open(out + ".json", "w"), indent=1)
    open(out + ".md", "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
