#!/usr/bin/env python3
"""torch SDPA decode (cuDNN, flash), timed the two ways attn_decode --bench times qevict's kernel.

  idle:   events around one call from an idle GPU, as ../shared/peers/peers.py times it (the
          host's submission of the call falls between the events);
  queued: the same call enqueued behind torch.cuda._sleep (a spin kernel), so that the events
          time the GPU's own work. The host's enqueue time is measured on every repetition and
          must stay under half the sleep (else the row says so: the queue was not ahead).

Same shapes and data as peers.py sdpa-decode (GQA, bf16, one query token). One JSON line a
(backend, shape). Usage: python3 bench/sdpa_queued.py [--shapes 32x1280,8x32768]
"""
import argparse, json, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SLEEP_CYCLES = 4_000_000  # ~2 ms at 2 GHz


def timed(fn, queued, rep, flush=None):
    ts, host = [], []
    for _ in range(rep):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if queued:
            if flush is not None:
                flush.zero_()  # untimed: evicts the previous call's lines from L2
            torch.cuda._sleep(SLEEP_CYCLES)
        h0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        host.append(time.perf_counter() - h0)
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2], max(host) * 1e3


def sleep_ms():
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(SLEEP_CYCLES)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x1280,8x32768")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--flush", action="store_true",
                    help="write 4x the L2's bytes before each queued call (attn_decode's "
                         "ATTN_FLUSH=1): inputs read from DRAM, as in a decode step")
    o = ap.parse_args()
    if o.rep < 1:
        ap.error("--rep: at least 1")
    shapes = []
    for shape in o.shapes.split(","):
        try:
            batch, seq = map(int, shape.split("x"))
        except ValueError:
            ap.error(f"--shapes: {shape!r} is not BATCHxSEQ (e.g. 32x1280)")
        if batch < 1 or seq < 1:
            ap.error(f"--shapes: {shape!r}: batch and sequence must be positive")
        shapes.append((batch, seq))
    s_ms = sleep_ms()
    flush = None
    if o.flush:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        flush = torch.empty(4 * l2, dtype=torch.uint8, device="cuda")
    for batch, seq in shapes:
        q = torch.randn(batch, o.hq, 1, o.dim, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(batch, o.hkv, seq, o.dim, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        kv_bytes = 2 * k.numel() * 2
        backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
        for name, be in backends:
            row = {"peer": f"torch-sdpa-{name}", "batch": batch, "seq": seq, "hq": o.hq,
                   "hkv": o.hkv, "dim": o.dim, "sleep_ms": round(s_ms, 3)}
            try:
                with sdpa_kernel([be]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
                    ms, _ = timed(fn, False, o.rep)
                    ms_gpu, host_ms = timed(fn, True, o.rep, flush)
                row.update(ms=ms, ms_gpu=ms_gpu, l2_flushed=o.flush, kv_GBps=kv_bytes / ms / 1e6,
                           kv_GBps_gpu=kv_bytes / ms_gpu / 1e6, host_enqueue_max_ms=host_ms,
                           queue_ahead=host_ms < 0.5 * s_ms)
            except Exception as e:  # a backend may not take this shape
                row["error"] = str(e)[:200]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
