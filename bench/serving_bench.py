#!/usr/bin/python3
"""serving_bench: the serving overhead and the latency of concurrent streams, measured in one run.

(a) One request, the same model, prompt, policy and greedy settings, run three ways back to back:
    in process (`qevict generate --json`: its prefill and decode times), and through the daemon
    (`qevict serve` + a Python grpcio client timing the stream: time to first token, decode
    tokens/s). Reported with their ratios (gRPC over in-process).
(b) 64 concurrent streams through the daemon: time to first token, inter-token latency and
    end-to-end latency percentiles, and the aggregate tokens/s.

usage: serving_bench.py QEVICT MODEL [--prompt-tokens N] [--new N] [--streams N] [--policy P]
Prints a markdown table; --json FILE also writes the figures."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import serving  # noqa: E402
import grpc  # noqa: E402

WORDS = ("the town council met on a cold morning to discuss the bridge the market and the river "
         "while the merchants argued about flax honey wool and the price of salt").split()


def prompt_text(n_words):
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


def in_process(a, text):
    best = None
    for _ in range(a.repeat):
        out = subprocess.run([a.qevict, "generate", "--model", a.model, "--prompt", text, "-n",
                              str(a.new), "--policy", a.policy, "--budget", str(a.budget),
                              "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)["summary"]
        # the first token comes out of the prefill step; the others are decode steps
        dtok = s.get("decode_tokens", s["generated_tokens"] - 1)
        r = {"ttft_s": s["prefill_s"], "tok_s": dtok / s["decode_s"] if s["decode_s"] > 0 else 0.0,
             "prompt_tokens": s["prompt_tokens"]}
        best = r if best is None else {k: (min if k == "ttft_s" else max)(best[k], r[k])
                                        for k in r}
    return best


def stream(gen, md, req):
    t0 = time.time()
    times = []
    for e in gen.Generate(req, metadata=md, timeout=3600):
        if e.HasField("tokens") and e.tokens.ids:
            times += [time.time()] * len(e.tokens.ids)
    return t0, times


def through_grpc(a, pb, gen, md, text):
    best = None
    for _ in range(a.repeat):
        req = pb.GenerateRequest(max_tokens=a.new, ignore_eos=True)
        req.prompt.text = text
        req.policy.name = a.policy
        if a.policy != "full":
            req.budget.fraction = a.budget
        t0, times = stream(gen, md, req)
        r = {"ttft_s": times[0] - t0, "tok_s": (len(times) - 1) / (times[-1] - times[0])}
        best = r if best is None else {k: (min if k == "ttft_s" else max)(best[k], r[k])
                                        for k in r}
    return best


def concurrent(a, pb, gen, md):
    res = [None] * a.streams

    def run(i):
        req = pb.GenerateRequest(max_tokens=a.conc_new, ignore_eos=True)
        req.prompt.text = prompt_text(a.conc_words + i % 7)
        req.policy.name = a.conc_policy
        res[i] = stream(gen, md, req)

    th = [threading.Thread(target=run, args=(i,)) for i in range(a.streams)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    ttft = [r[1][0] - r[0] for r in res]
    itl = [b - x for r in res for x, b in zip(r[1], r[1][1:])]
    e2e = [r[1][-1] - r[0] for r in res]
    n = sum(len(r[1]) for r in res)
    return {"streams": a.streams, "tokens": n, "wall_s": wall, "tok_s": n / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qevict")
    ap.add_argument("model")
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--policy", default="qevict")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--conc-words", type=int, default=24)
    ap.add_argument("--conc-new", type=int, default=32)
    ap.add_argument("--conc-policy", default="full")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.qevict, a.model = os.path.abspath(a.qevict), os.path.abspath(a.model)
    tmp = serving.tmpdir()
    pb, pbg, _, _ = serving.load_stubs(tmp)
    text = prompt_text(a.words)
    local = in_process(a, text)
    srv = serving.Server(a.qevict, a.model, os.path.join(tmp, "state"), workers=1).start()
    ch = grpc.insecure_channel(srv.addr)
    amd = (("authorization", "Bearer " + srv.admin_key()),)
    r = pb.SetTenantRequest()
    r.tenant.id, r.tenant.kv_quota_bytes = "bench", 1 << 40
    key = pbg.AdminStub(ch).SetTenant(r, metadata=amd, timeout=10).api_key
    md = (("authorization", "Bearer " + key),)
    gen = pbg.GenerationStub(ch)
    remote = through_grpc(a, pb, gen, md, text)
    conc = concurrent(a, pb, gen, md)
    srv.stop()
    out = {"in_process": local, "grpc": remote, "concurrent": conc,
           "config": {k: v for k, v in vars(a).items() if k not in ("json",)}}
    print("| %d-token prompt, %d new tokens, %s %.0f%% | in process | through gRPC | gRPC / in-process |"
          % (local["prompt_tokens"], a.new, a.policy, 100 * a.budget))
    print("|---|---|---|---|")
    print("| time to first token | %.1f ms | %.1f ms | %.2f |" % (1e3 * local["ttft_s"],
          1e3 * remote["ttft_s"], remote["ttft_s"] / local["ttft_s"]))
    print("| decode tokens/s | %.1f | %.1f | %.2f |" % (local["tok_s"], remote["tok_s"],
          remote["tok_s"] / local["tok_s"]))
    print()
    print("| %d concurrent streams (~%d-token prompts, %d new, %s) | p50 | p90 | p99 |"
          % (conc["streams"], int(a.conc_words * 1.3), a.conc_new, a.conc_policy))
    print("|---|---|---|---|")
    for k, name in (("ttft", "time to first token"), ("itl", "inter-token latency")):
        print("| %s | %.0f ms | %.0f ms | %.0f ms |" % (name, 1e3 * conc[k + "_p50"],
              1e3 * conc[k + "_p90"], 1e3 * conc[k + "_p99"]))
    print("| end to end | %.2f s | | %.2f s |" % (conc["e2e_p50"], conc["e2e_p99"]))
    print("\naggregate: %d tokens in %.1f s = %.1f tokens/s" % (conc["tokens"], conc["wall_s"],
          conc["tok_s"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
