#!/usr/bin/env python3
"""multi_gpu_graphs.py OUT T: the table of bench/multi_gpu.sh PHASE=graphs (CUDA graphs under
tensor parallelism). Equality: TP=T with graphs against TP=T eager, token by token and top-2
logits at every step. Timing: TPOT (decode seconds / steps) with graphs and eager at TP=T, and
TP=1 with graphs, FullKV and QEvict 20%."""
import json
import os
import sys


def load(out, name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def graphs(d):
    g = (d or {}).get("graphs") or {}
    return "captures %s replays %s warmups %s eager %s" % tuple(
        g.get(k, "-") for k in ("captures", "replays", "warmups", "eager_steps"))


def equal_rows(out, t):
    for pol in ("full", "q20"):
        g, e = load(out, "geq_%s_tp%d" % (pol, t)), load(out, "eeq_%s_tp%d" % (pol, t))
        if not g or not e:
            print("| equal %s | missing run |" % pol)
            continue
        same = sum(a == b for a, b in zip(g["tokens"], e["tokens"]))
        top2 = sum(a == b for a, b in zip(g.get("top2", []), e.get("top2", [])))
        print("| equal %s TP=%d | tokens %d/%d equal, top-2 %d/%d bit-equal | %s |" % (
            pol, t, same, len(e["tokens"]), top2, len(e.get("top2", [])), graphs(g)))


def tpot(d):
    s = (d or {}).get("summary") or {}
    if "decode_s" not in s:
        return None
    steps = s.get("decode_steps", s.get("generated_tokens", 1) - 1)  # decode-only steps
    return 1e3 * s["decode_s"] / steps if steps > 0 else None


def timing_rows(out, t):
    print("| policy | TP=%d graphs TPOT | TP=%d eager TPOT | graphs/eager | TP=1 graphs TPOT "
          "| TP=1/TP=%d |" % (t, t, t))
    print("| --- | --- | --- | --- | --- | --- |")
    for pol in ("full", "q20"):
        g, e = tpot(load(out, "gb32_%s_tp%d" % (pol, t))), tpot(load(out, "eb32_%s_tp%d" % (pol, t)))
        one = tpot(load(out, "gb32_%s_tp1" % pol))
        f = lambda x: "%.2f ms" % x if x else "-"
        r = lambda a, b: "%.3f" % (a / b) if a and b else "-"
        print("| %s | %s | %s | %s | %s | %s |" % (pol, f(g), f(e), r(g, e), f(one), r(one, g)))
    print("graphs (TP=%d, B=32): full %s; q20 %s" % (
        t, graphs(load(out, "gb32_full_tp%d" % t)), graphs(load(out, "gb32_q20_tp%d" % t))))


def main():
    out, t = sys.argv[1], int(sys.argv[2])
    print("| check | result | graph statistics (graphs run) |")
    print("| --- | --- | --- |")
    equal_rows(out, t)
    print()
    timing_rows(out, t)


if __name__ == "__main__":
    main()
