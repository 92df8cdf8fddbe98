#!/usr/bin/env python3
"""ncu_kernel_times.py: sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Usage: ncu_kernel_times.py LOG [STEPS]   (STEPS: how many decode steps the profiled range held;
the table then also gives milliseconds a step). Prints kernels by total time, largest first,
with their launch counts and share; lines that are not ncu's CSV rows are skipped."""
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_kernel_times.py LOG [STEPS]")
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    tot, cnt, unit = {}, {}, None
    with open(sys.argv[1], errors="replace") as f:
        rows = csv.reader(line for line in f if line.startswith('"'))
        head = None
        for r in rows:
            if head is None:
                if "Kernel Name" in r and "Metric Name" in r:
                    head = {k: i for i, k in enumerate(r)}
                continue
            if len(r) < len(head) or r[head["Metric Name"]] != "gpu__time_duration.sum":
                continue
            name = r[head["Kernel Name"]].split("(")[0].split("<")[0].strip()
            unit = r[head["Metric Unit"]]
            v = float(r[head["Metric Value"]].replace(",", ""))
            tot[name] = tot.get(name, 0.0) + v
            cnt[name] = cnt.get(name, 0) + 1
    if not tot:
        sys.exit("ncu_kernel_times: no gpu__time_duration rows in " + sys.argv[1])
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
    all_ms = sum(tot.values()) * scale
    print("%-44s %8s %12s %10s %6s" % ("kernel", "launches", "ms total", "ms/step", "share"))
    for k in sorted(tot, key=tot.get, reverse=True):
        ms = tot[k] * scale
        print("%-44s %8d %12.3f %10.3f %5.1f%%" % (k[:44], cnt[k], ms, ms / steps, 100 * ms / all_ms))
    print("%-44s %8d %12.3f %10.3f" % ("all", sum(cnt.values()), all_ms, all_ms / steps))


if __name__ == "__main__":
    main()
