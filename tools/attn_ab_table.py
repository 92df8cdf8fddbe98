#!/usr/bin/env python3
"""attn_ab_table: the decode-attention bench (attn_decode --bench logs) of a base against a new
binary: per shape, the median over rounds of the automatic chunking's time (and of the FullKV
shapes' time without masses, and of the chunk kernel alone; "(gpu)": the same launches queued
behind a held stream, where the log has them), base ms, new ms, new / base.
Usage: attn_ab_table.py BASE_LOG... -- NEW_LOG..."""
import json
import statistics
import sys


def times(paths):
    t = {}
    for path in paths:
        for line in open(path):
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            name = j.get("bench") or ""
            if name == "copy":
                t.setdefault("copy_GBps", []).append(j["GBps_read_plus_write"])
            elif j.get("auto") or name.endswith("_no_masses"):
                t.setdefault(name, []).append(j["ms"])
                if "ms_gpu" in j:  # the launch queued behind a held stream (the GPU's own time)
                    t.setdefault(name + " (gpu)", []).append(j["ms_gpu"])
                if j.get("auto") and "ms_chunk_kernel_only" in j:
                    t.setdefault(name + " (chunk kernel)", []).append(j["ms_chunk_kernel_only"])
    return {k: statistics.median(v) for k, v in t.items()}


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__)
    i = sys.argv.index("--")
    base, new = times(sys.argv[1:i]), times(sys.argv[i + 1:])
    print("%-34s %10s %10s %8s" % ("shape", "base ms", "new ms", "new/base"))
    for k in base:
        if k in new:
            print("%-34s %10.4f %10.4f %8.3f" % (k, base[k], new[k], new[k] / base[k]))


if __name__ == "__main__":
    main()
