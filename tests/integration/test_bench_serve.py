#!/usr/bin/python3
"""test_bench_serve: `qevict bench serve` against a real `qevict serve` (stories260K, one CPU
worker): its JSON and text reports add up (every request completed, the token counts, the
number of latency samples, percentiles in order), a KV budget shows in the reserved bytes, the
Poisson arrivals and a shared prompt run, --random-range-ratio varies the lengths within their
bounds, --input-len's prompts have exactly that many tokens, --goodput counts exactly the requests within its SLOs, a refused key stops it early with
exit 3, an
unreachable server exits 1, a request the server refuses is reported with the server's message,
Ctrl-C cancels the streams (exit 130, nothing left running) and bad options exit 2.
usage: test_bench_serve.py QEVICT_BINARY   (exit 77 = skipped)"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402

QEVICT = os.path.abspath(sys.argv[1])
STORIES = serving.stories_path()
TMP = serving.tmpdir()
C = serving.Checks()


def bench(srv, key, *args, timeout=300):
    env = dict(os.environ, QEVICT_SERVER=srv.addr)
    env.pop("QEVICT_API_KEY", None)
    return subprocess.run([QEVICT, "bench", "serve", "--key", key] + list(args),
                          capture_output=True, text=True, timeout=timeout, env=env)


def report(r):
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def ordered(d):
    return d["n"] == 0 or d["p50"] <= d["p90"] <= d["p99"] <= d["max"]


def test_report(srv, key):
    lines_path = os.path.join(TMP, "report.jsonl")
    r = bench(srv, key, "--requests", "24", "--concurrency", "6", "-n", "12", "--ignore-eos",
              "--input-words", "40", "--json", "--save-result", lines_path)
    j = report(r)
    C.ok(r.returncode == 0 and j is not None, "bench serve --json: exit %d" % r.returncode)
    if not j:
        print(r.stdout[-500:], r.stderr[-500:])
        return
    C.ok(j["completed"] == 24 and j["failed"] == 0 and j["not_sent"] == 0,
         "24 requests completed, none failed")
    C.ok(j["output_tokens"] == 24 * 12, "output tokens %d = 24 x 12" % j["output_tokens"])
    C.ok(j["prompt_tokens"] > 24 * 40 / 2, "prompt tokens counted: %d" % j["prompt_tokens"])
    C.ok(j["ttft_ms"]["n"] == 24 and j["tpot_ms"]["n"] == 24 and j["e2e_ms"]["n"] == 24
         and j["queue_ms"]["n"] == 24, "a TTFT, TPOT, E2E and queue sample per request")
    C.ok(24 <= j["itl_ms"]["n"] <= 24 * 11,
         "inter-token gaps: %d (at most 11 a request)" % j["itl_ms"]["n"])
    C.ok(all(ordered(j[k + "_ms"]) for k in ("ttft", "tpot", "itl", "e2e", "queue")),
         "p50 <= p90 <= p99 <= max for every latency")
    e2e = [json.loads(ln)["e2e_ms"] for ln in open(lines_path)]
    mean = sum(e2e) / len(e2e)
    std = (sum((x - mean) ** 2 for x in e2e) / len(e2e)) ** 0.5
    d = j["e2e_ms"]
    C.ok(len(e2e) == 24 and abs(d["mean"] - mean) < 1e-3 * mean + 0.01 and
         abs(d["std"] - std) < 1e-3 * std + 0.01,
         "E2E mean %.3f and std %.3f ms agree with the per-request lines (%.3f, %.3f)"
         % (d["mean"], d["std"], mean, std))
    C.ok(j["e2e_ms"]["max"] >= j["ttft_ms"]["max"] and j["output_throughput"] > 0,
         "E2E at least TTFT; throughput %.1f tokens/s" % j["output_throughput"])
    save = os.path.join(TMP, "results.jsonl")
    r = bench(srv, key, "--requests", "6", "--concurrency", "3", "-n", "4", "--ignore-eos",
              "--input-words", "10", "--save-result", save)
    lines = [json.loads(ln) for ln in open(save)] if os.path.exists(save) else []
    C.ok(sorted(x["request"] for x in lines) == list(range(6)) and
         all(x["status"] == "OK" and x["output_tokens"] == 4 and x["finish"] == "length" and
             x["e2e_ms"] >= x["ttft_ms"] > 0 for x in lines),
         "--save-result: a line per request, each OK with 4 tokens (%d lines)" % len(lines))
    C.ok(r.returncode == 0 and "completed 6, failed 0" in r.stdout and "\nTTFT " in r.stdout,
         "text report: %s" % (r.stdout.splitlines() or ["nothing"])[0])


def test_budget(srv, key):
    common = ["--requests", "8", "--concurrency", "4", "-n", "8", "--ignore-eos",
              "--input-words", "60", "--json"]
    full = report(bench(srv, key, *common, "--policy", "full"))
    tier = report(bench(srv, key, *common, "--policy", "qevict", "--budget", "0.25"))
    ok = full and tier and full["completed"] == 8 and tier["completed"] == 8
    ratio = tier["reserved_bytes_mean"] / full["reserved_bytes_mean"] if ok else 0
    C.ok(ok and 0.2 < ratio < 0.3,
         "QEvict at 25%% reserves %.3f of FullKV's bytes a request" % ratio)


def test_modes(srv, key):
    j = report(bench(srv, key, "--requests", "10", "--concurrency", "4", "--rate", "40", "-n",
                     "4", "--ignore-eos", "--input-words", "10", "--json"))
    C.ok(j and j["completed"] == 10 and j["rate"] == 40, "--rate 40: 10 requests completed")
    j = report(bench(srv, key, "--requests", "4", "--concurrency", "2", "--prompt",
                     "Once upon a time", "-n", "4", "--ignore-eos", "--warmup", "2", "--json"))
    C.ok(j and j["completed"] == 4 and j["prompt_tokens"] % 4 == 0,
         "a shared --prompt and --warmup 2: 4 requests of equal prompts")


def test_range(srv, key):
    save = os.path.join(TMP, "range.jsonl")
    r = bench(srv, key, "--requests", "16", "--concurrency", "4", "-n", "12", "--ignore-eos",
              "--input-words", "40", "--random-range-ratio", "0.5", "--json", "--save-result",
              save)
    j = report(r)
    lines = [json.loads(ln) for ln in open(save)] if os.path.exists(save) else []
    outs = [x["output_tokens"] for x in lines]
    words = [x["input_words"] for x in lines]
    C.ok(j and j["completed"] == 16 and len(lines) == 16 and
         all(x["output_tokens"] == x["max_tokens"] for x in lines) and
         all(6 <= n <= 18 for n in outs) and all(20 <= w <= 60 for w in words) and
         len(set(outs)) > 3 and len(set(words)) > 3 and j["output_tokens"] == sum(outs),
         "--random-range-ratio 0.5: output tokens %s in [6, 18], words in [20, 60]"
         % sorted(outs))
    prompts = [x["prompt_tokens"] for x in sorted(lines, key=lambda x: x["input_words"])]
    C.ok(prompts[0] < prompts[-1], "longer synthetic prompts, more prompt tokens (%d .. %d)"
         % (prompts[0], prompts[-1]))
    save2 = os.path.join(TMP, "range2.jsonl")
    bench(srv, key, "--requests", "16", "--concurrency", "4", "-n", "12", "--ignore-eos",
          "--input-words", "40", "--random-range-ratio", "0.5", "--save-result", save2)
    again = {x["request"]: (x["max_tokens"], x["input_words"]) for x in
             (json.loads(ln) for ln in open(save2))} if os.path.exists(save2) else {}
    C.ok(again == {x["request"]: (x["max_tokens"], x["input_words"]) for x in lines},
         "the same --prompt-seed draws the same lengths")


def test_input_len(srv, key):
    save = os.path.join(TMP, "len.jsonl")
    r = bench(srv, key, "--requests", "8", "--concurrency", "4", "-n", "4", "--ignore-eos",
              "--input-len", "50", "--tokenizer", STORIES, "--json", "--save-result", save)
    j = report(r)
    lines = [json.loads(ln) for ln in open(save)] if os.path.exists(save) else []
    C.ok(j and j["completed"] == 8 and j["prompt_tokens"] == 8 * 50 and
         all(x["prompt_tokens"] == x["input_len"] == 50 for x in lines),
         "--input-len 50: every prompt 50 tokens by the server's count (%s)"
         % (j and j["prompt_tokens"]))
    r = bench(srv, key, "--requests", "8", "--concurrency", "4", "-n", "4", "--ignore-eos",
              "--input-len", "40", "--tokenizer", STORIES, "--random-range-ratio", "0.5",
              "--save-result", save)
    lines = [json.loads(ln) for ln in open(save)] if os.path.exists(save) else []
    lens = [x["prompt_tokens"] for x in lines]
    C.ok(r.returncode == 0 and len(lines) == 8 and
         all(x["prompt_tokens"] == x["input_len"] for x in lines) and
         all(20 <= n <= 60 for n in lens) and len(set(lens)) > 2,
         "--input-len 40 --random-range-ratio 0.5: prompts of %s tokens" % sorted(lens))


def test_goodput(srv, key):
    save = os.path.join(TMP, "goodput.jsonl")
    r = bench(srv, key, "--requests", "12", "--concurrency", "6", "-n", "8", "--ignore-eos",
              "--input-words", "30", "--json", "--save-result", save)
    j = report(r)
    e2e = sorted(json.loads(ln)["e2e_ms"] for ln in open(save)) if os.path.exists(save) else []
    if not j or len(e2e) != 12:
        C.ok(False, "goodput: the first run failed (exit %d)" % r.returncode)
        return
    for slo in ("ttft:1e7,tpot:1e7", "e2e:0.001", "e2e:%.3f,ttft:1e7" % e2e[6]):
        r = bench(srv, key, "--requests", "12", "--concurrency", "6", "-n", "8", "--ignore-eos",
                  "--input-words", "30", "--json", "--goodput", slo, "--save-result", save)
        j = report(r)
        lines = [json.loads(ln) for ln in open(save)]
        b = dict((kv.split(":")[0], float(kv.split(":")[1])) for kv in slo.split(","))
        want = [all(x[k + "_ms"] <= v for k, v in b.items()) for x in lines]
        g = j and j.get("goodput")
        C.ok(g is not None and g["met"] == sum(want) == sum(x["slo_met"] for x in lines) and
             [x["slo_met"] for x in lines] == want and g["slo_ms"] == b and
             abs(g["request_goodput"] - g["met"] / j["duration_s"]) <=
             1e-4 * g["request_goodput"],
             "--goodput %s: %s of 12 within, as the per-request lines say" %
             (slo, g and g["met"]))
    r = bench(srv, key, "--requests", "3", "-n", "2", "--goodput", "ttft:1e7")
    C.ok(r.returncode == 0 and "goodput: " in r.stdout and "3 of 3 completed requests within "
         "ttft 1e+07 ms" in r.stdout, "--goodput in the text report: %s" %
         [ln for ln in r.stdout.splitlines() if ln.startswith("goodput")])


def test_failures(srv, key):
    r = bench(srv, "qk_" + "0" * 64, "--requests", "40", "-n", "4")
    j = r.stdout
    C.ok(r.returncode == 3 and "UNAUTHENTICATED" in r.stderr and "not sent" in j,
         "a refused key: exit %d, stops early (%s)" % (r.returncode, j.splitlines()[0] if j else ""))
    # (--rate: the requests waiting for their arrival time had still gone out, each refused)
    r = bench(srv, "qk_" + "0" * 64, "--requests", "40", "-n", "4", "--rate", "4")
    m = re.search(r"failed (\d+), not sent (\d+)", r.stdout)
    C.ok(r.returncode == 3 and m and int(m.group(2)) >= 30 and
         int(m.group(1)) + int(m.group(2)) == 40,
         "a refused key at --rate 4: exit %d, %s" % (r.returncode, m and m.group(0)))
    r = bench(srv, key, "--requests", "2", "-n", "2", "--save-result", os.path.join(TMP, "no",
                                                                                 "such"))
    C.ok(r.returncode == 2 and "--save-result" in r.stderr,
         "an unwritable --save-result before anything is sent: exit %d" % r.returncode)
    r = bench(srv, "qk_" + "0" * 64, "--requests", "4", "-n", "4", "--warmup", "1")
    C.ok(r.returncode == 3 and "warm-up request failed" in r.stderr and "UNAUTHENTICATED" in
         r.stderr, "a refused key in the warm-up: exit %d, %s" % (r.returncode, r.stderr.strip()))
    r = subprocess.run([QEVICT, "bench", "serve", "--server", "127.0.0.1:%d" % serving.free_port(),
                        "--key", key, "--requests", "3", "-n", "2"], capture_output=True,
                       text=True, timeout=120)
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr, "no server: exit %d" % r.returncode)
    r = bench(srv, key, "--requests", "3", "-n", "2", "--policy", "qevict", "--budget", "16")
    C.ok(r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "budget" in r.stderr,
         "a budget below the minimum: exit %d, %s" % (r.returncode, r.stderr.strip()[-120:]))


def interrupt(p):
    """Sends SIGINT to p and collects its output (killed if it takes more than 30 s)."""
    p.send_signal(signal.SIGINT)
    try:
        return p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()


def running(srv):
    v = srv.metric("qevict_requests_running")
    return -1 if v is None else v


def test_interrupt(srv, key):
    env = dict(os.environ, QEVICT_SERVER=srv.addr)
    p = subprocess.Popen([QEVICT, "bench", "serve", "--key", key, "--requests", "200",
                          "--concurrency", "4", "-n", "400", "--ignore-eos", "--input-words",
                          "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    deadline = time.time() + 30
    while running(srv) < 1 and time.time() < deadline:
        time.sleep(0.05)
    out, err = interrupt(p)
    deadline = time.time() + 10
    while running(srv) != 0 and time.time() < deadline:
        time.sleep(0.1)
    C.ok(p.returncode == 130 and "interrupted" in err and running(srv) == 0,
         "Ctrl-C: exit %d, streams cancelled (running now %s)" % (p.returncode, running(srv)))


def test_interrupt_between_arrivals(srv, key):
    """Ctrl-C while every thread waits for its Poisson arrival: the report so far, exit 130."""
    env = dict(os.environ, QEVICT_SERVER=srv.addr)
    p = subprocess.Popen([QEVICT, "bench", "serve", "--key", key, "--requests", "3", "--rate",
                          "0.02", "-n", "4", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(2.0)  # (the first request is done; the next arrive ~50 s apart)
    t0 = time.time()
    out, err = interrupt(p)
    j = report(type("R", (), {"stdout": out})())
    C.ok(p.returncode == 130 and j is not None and j["completed"] == 1 and time.time() - t0 < 5,
         "Ctrl-C between Poisson arrivals: exit %d in %.1f s, report %s" %
         (p.returncode, time.time() - t0, j and {k: j[k] for k in ("completed", "not_sent")}))


def test_usage():
    cases = [(["bench"], "serve"), (["bench", "nosuch"], "unknown benchmark"),
             (["bench", "serve", "--concurrency", "0"], "--concurrency"),
             (["bench", "serve", "--requests", "x"], "--requests"),
             (["bench", "serve", "--rate", "-1"], "--rate"),
             (["bench", "serve", "--detach"], "--detach"),
             (["bench", "serve", "--prompt", "a", "--ids", "1"], "at most one"),
             (["bench", "serve", "--policy", "lru"], "--policy"),
             (["bench", "serve", "--random-range-ratio", "1"], "--random-range-ratio"),
             (["bench", "serve", "--goodput", "ttft"], "not ttft:MS"),
             (["bench", "serve", "--goodput", "itl:5"], "'itl:5' is not"),
             (["bench", "serve", "--goodput", "tpot:0"], "tpot:0"),
             (["bench", "serve", "--goodput", " "], "no SLO"),
             (["bench", "serve", "--goodput", ","], "an empty item"),
             (["bench", "serve", "--goodput", "ttft:5,"], "an empty item"),
             (["bench", "serve", "--goodput", "ttft:100,tpot:5,ttft:200"], "ttft given twice"),
             (["bench", "serve", "--input-len", "5"], "go together"),
             (["bench", "serve", "--input-len", "5", "--tokenizer", STORIES, "--input-words",
               "3"], "give no --input-words"),
             (["bench", "serve", "--input-len", "5", "--tokenizer", "/nonexistent.gguf"],
              "--tokenizer '/nonexistent.gguf'")]
    for args, want in cases:
        r = subprocess.run([QEVICT] + args, capture_output=True, text=True, timeout=30)
        C.ok(r.returncode == 2 and want in (r.stderr + r.stdout),
             "qevict %s: exit %d" % (" ".join(args), r.returncode))
    r = subprocess.run([QEVICT, "bench", "serve", "--help"], capture_output=True, text=True)
    C.ok(r.returncode == 0 and r.stdout.startswith("usage: qevict bench serve"), "--help")


def main():
    test_usage()
    srv = serving.Server(QEVICT, STORIES, os.path.join(TMP, "state"), workers=1)
    srv.start()
    admin = srv.admin_key()
    env = dict(os.environ, QEVICT_SERVER=srv.addr, QEVICT_ADMIN_KEY=admin)
    out = subprocess.run([QEVICT, "tenant", "set", "b1", "--quota", "1G"], capture_output=True,
                         text=True, env=env, timeout=60).stdout
    key = [t for t in out.split() if t.startswith("qk_") and len(t) == 67][0]
    test_report(srv, key)
    test_budget(srv, key)
    test_modes(srv, key)
    test_range(srv, key)
    test_input_len(srv, key)
    test_goodput(srv, key)
    test_failures(srv, key)
    test_interrupt(srv, key)
    test_interrupt_between_arrivals(srv, key)
    srv.stop()
    rc = C.done()
    shutil.rmtree(TMP, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
