#!/usr/bin/env python3
"""multi_gpu_report.py OUT: the table of bench/multi_gpu.sh from the JSON files in OUT."""
import glob
import json
import os
import sys

OUT = sys.argv[1]


def load(name):
    try:
        for line in open(os.path.join(OUT, name)):
            if line.startswith("{"):
                return json.loads(line)
    except (OSError, ValueError):
        return None
    return None


def rc(name):
    try:
        return open(os.path.join(OUT, "rc_" + name)).read().split()[-1]
    except OSError:
        return "n/a"


def first_div(a, b):
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    return "identical" if n is None and len(a) == len(b) else "first divergence at %s" % n


def equality(ref_name, run_name, forced_name, label):
    ref, run, forced = load(ref_name), load(run_name), load(forced_name)
    if not ref or not (run or forced):
        return
    line = label + ": "
    if run:
        line += first_div(ref["tokens"], run["tokens"])
    if forced and "top2" in ref:
        line += "; teacher-forced on the reference: %d of %d steps agree" % (
            forced["agree"], forced["forced"])
        gaps = []
        for i, (r, f) in enumerate(zip(ref["top2"], forced["top2"])):
            if int(f[0]) != int(r[0]):
                other = "%.4g" % (r[1] - r[3]) if int(f[0]) == int(r[2]) else "not its top-2"
                gaps.append("step %d: ref gap %s, run gap %.4g" % (i, other, f[1] - f[3]))
        if gaps:
            line += " (" + "; ".join(gaps[:6]) + ("; ..." if len(gaps) > 6 else "") + ")"
        margins = sorted(r[1] - r[3] for r in ref["top2"])
        line += "; smallest reference top-2 gaps %s" % ", ".join("%.3g" % m for m in margins[:3])
    print(line)


def engine(name):
    j = load(name + ".json")
    if not j:
        return None
    s = j["summary"]
    steps = s.get("decode_steps", s["generated_tokens"] - 1)  # decode-only steps
    ranks = j.get("ranks", [])
    ar = ranks[0] if ranks else {}
    return {
        "ttft": s["prefill_s"] * 1e3,  # speedup and efficiency: against the table's smallest TP
        "tpot": s["decode_s"] / steps * 1e3 if steps > 0 else float("nan"),
        "tok_s": s.get("decode_tokens", s["batch"] * steps) / s["decode_s"] if s["decode_s"] > 0 else 0,
        "tp": s["tp"], "steps": s["steps"], "decode_ms": s["decode_s"] * 1e3,
        "ar_ms": (ar.get("allreduce_ms") or 0) / s["steps"] if ar.get("allreduce_calls") else None,
        "ar_calls": (ar.get("allreduce_calls") or 0) / s["steps"] if ar.get("allreduce_calls") else None,
        "ranks": ranks, "mem": j.get("memory", {}),
    }


def pool(r):
    if r.get("pool_units") is None:
        return "-"
    return "%s/%s (peak %s)" % (r["pool_units_in_use"], r["pool_units"], r["pool_units_peak"])


def engine_table(prefix, tps, label):
    rows = []
    for pol in ("full", "q20"):
        base = engine("%s_%s_tp%d" % (prefix, pol, tps[0]))
        for t in tps:
            e = engine("%s_%s_tp%d" % (prefix, pol, t))
            if not e:
                continue
            sp = base["tpot"] / e["tpot"] if base else float("nan")  # against the smallest TP
            rows.append((pol, t, e, sp))
    if not rows:
        return
    print("\n%s" % label)
    print("%-6s %3s %9s %8s %9s %8s %6s %10s %9s  %s" % (
        "policy", "TP", "TTFT ms", "TPOT ms", "tok/s", "speedup", "eff", "AR ms/step", "AR/step",
        "per rank: GPU GB used, KV pool units in use/total (peak)"))
    for pol, t, e, sp in rows:
        ar = "%.3f" % e["ar_ms"] if e["ar_ms"] is not None else "-"
        arc = "%.0f" % e["ar_calls"] if e["ar_calls"] is not None else "-"
        ranks = "; ".join("r%d %.1f, %s" % (r["rank"], (r.get("gpu_used_bytes") or 0) / 2**30, pool(r))
                          for r in e["ranks"])
        print("%-6s %3d %9.1f %8.3f %9.1f %7.2fx %5.0f%% %10s %9s  %s" % (
            pol, t, e["ttft"], e["tpot"], e["tok_s"], sp, 100 * sp * tps[0] / t, ar, arc, ranks))
    for t in tps:
        f, q = engine("%s_full_tp%d" % (prefix, t)), engine("%s_q20_tp%d" % (prefix, t))
        if f and q:
            m = q["mem"]
            share = ""
            if m.get("routing_passes_decode"):
                dec_ms = q["decode_ms"]
                share = ", routing %.1f ms of %.0f ms decode (%.1f%%, %d passes)" % (
                    m["routing_gpu_ms_decode"], dec_ms, 100 * m["routing_gpu_ms_decode"] / dec_ms,
                    m["routing_passes_decode"])
            print("TP=%d: QEvict 20%% / FullKV TPOT %.3f%s" % (t, q["tpot"] / f["tpot"], share))


def main():
    print("checks: " + " | ".join("%s rc %s" % (t, rc(t)) for t in
                                  ("test_kern_cuda", "test_kv_gpu", "test_kc_quant")))
    tps = sorted({int(os.path.basename(p).split("_tp")[1][:-5])
                  for p in glob.glob(OUT + "/eq_tp*.json") + glob.glob(OUT + "/eqf_tp*.json")})
    for t in tps[1:]:
        equality("eq_tp1.json", "eq_tp%d.json" % t, "eqf_tp%d.json" % t,
                 "llama3-8b greedy TP=%d vs TP=1 (256 steps)" % t)
    tps = sorted(int(p.rsplit("tp", 1)[1][:-5]) for p in glob.glob(OUT + "/b32_full_tp*.json")
                 if "untimed" not in p)
    if tps:
        engine_table("b32", tps, "llama3-8b shape, B=32, prompt 256, 256 new (all-reduces timed)")
        t = tps[-1]
        a, b = engine("b32_full_tp%d" % t), engine("b32_full_tp%d_untimed" % t)
        if a and b:
            print("TP=%d FullKV TPOT untimed %.3f ms vs timed %.3f ms" % (t, b["tpot"], a["tpot"]))
    for p in sorted(glob.glob(OUT + "/ttft32k_tp*.json")):
        e = engine(os.path.basename(p)[:-5])
        if e:
            print("one 32K-token prompt, TP=%d: TTFT %.0f ms (prefill %.0f tok/s)" % (
                e["tp"], e["ttft"], 32768 / e["ttft"] * 1e3))
    t70 = sorted(int(p.rsplit("tp", 1)[1][:-5]) for p in glob.glob(OUT + "/b32_70b_full_tp*.json"))
    if t70:
        equality("b1_70b_tp%d.json" % t70[0], "none", "b1f_70b_tp%d.json" % t70[-1],
                 "llama3-70b greedy TP=%d vs TP=%d (64 steps)" % (t70[-1], t70[0]))
        engine_table("b32_70b", t70, "llama3-70b shape, B=32, prompt 256, 128 new")
    longs = sorted(glob.glob(OUT + "/long_full_tp*.json"))
    if longs:
        print("\n32K context (long_ctx): tp, policy, sequences, tokens/s, step ms, AR ms/step, QEvict/FullKV")
        for p in longs:
            t = p.rsplit("tp", 1)[1][:-5]
            f, q = load("long_full_tp%s.json" % t), load("long_qevict_tp%s.json" % t)
            for name, j in (("full", f), ("qevict", q)):
                if j:
                    print("TP=%s %-6s %4d seqs %8.1f tok/s %8.2f ms %s" % (
                        t, name, j["sequences"], j["tokens_per_s"], j["step_ms"],
                        j.get("allreduce_ms_per_step", "-")))
            if f and q:
                print("TP=%s QEvict 20%%/FullKV: %.2fx sequences, %.2fx tokens/s" % (
                    t, q["sequences"] / f["sequences"], q["tokens_per_s"] / f["tokens_per_s"]))
    if load("sm_tp1.json"):
        equality("sm_tp1.json", "sm_cpu.json", "smf_cpu.json", "SmolLM2 greedy CPU vs GPU TP=1")
        for t in (2, 3):
            equality("sm_tp1.json", "sm_tp%d.json" % t, "smf_tp%d.json" % t,
                     "SmolLM2 greedy GPU TP=%d vs TP=1" % t)
    try:
        print("\n" + "".join(l for l in open(os.path.join(OUT, "serve_gpu.log"))
                             if l.startswith("serve_gpu:")))
    except OSError:
        pass


main()
