#!/usr/bin/python3
"""test_serving_long: a 32K-token prompt travels through the daemon. A random llama with a 40K
context (written by rand_gguf, since no small downloadable model has one) is served by `qevict
serve`; a Python grpcio client submits a 32,768-token prompt (token ids) with Submit, a second
client watches it, and the job finishes with its whole prompt counted, under a 10% QEvict
budget. Then a TP group whose KV heads split unevenly holds its pool's bound.
usage: test_serving_long.py QEVICT RAND_GGUF   (exit 77 = skipped)"""
import os
import random
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402

grpc = serving.need_grpc()

QEVICT, RAND_GGUF = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TMP = serving.tmpdir()
pb, pbg, _, _ = serving.load_stubs(TMP)
C = serving.Checks()
N_PROMPT = 32768


def tenant_md(srv, ch, tid):
    """Call metadata of a new tenant tid (1 GiB quota), created over channel ch."""
    r = pb.SetTenantRequest()
    r.tenant.id, r.tenant.kv_quota_bytes = tid, 1 << 30
    admin_md = (("authorization", "Bearer " + srv.admin_key()),)
    api_key = pbg.AdminStub(ch).SetTenant(r, metadata=admin_md, timeout=10).api_key
    return (("authorization", "Bearer " + api_key),)


def tenant_gen(srv, tid):
    """The Generation service's gRPC client over a new channel and the call metadata of a new
    tenant tid."""
    ch = grpc.insecure_channel(srv.addr)
    return pbg.GenerationStub(ch), tenant_md(srv, ch, tid)


def uneven_tp():
    """A TP group whose KV heads split unevenly (4 over --tp 3: 1, 1 and 2): each rank holds its
    share of a budget by heads, so the rank of two heads bounds the group at twice its pool,
    not the sum of the three (a budget between them had been admitted and overran that rank)."""
    model = os.path.join(TMP, "uneven.gguf")
    subprocess.run([RAND_GGUF, model, "--ctx", "4096", "--layers", "2", "--heads", "4", "--kv",
                    "4"], check=True)
    pool = 1 << 20
    srv = serving.Server(QEVICT, model, os.path.join(TMP, "state-tp3"), workers=1,
                         extra=["--tp", "3", "--pool-bytes", str(pool), "--max-seqs", "2"]).start()
    gen, md = tenant_gen(srv, "uneven-tp")

    def run(budget):
        req = pb.GenerateRequest(max_tokens=1500, ignore_eos=True)
        req.prompt.token_ids.ids.extend(range(3, 40))
        req.policy.name, req.budget.bytes = "qevict", budget
        try:
            return grpc.StatusCode.OK, list(gen.Generate(req, metadata=md, timeout=300))
        except grpc.RpcError as e:
            return e.code(), e.details()

    code, det = run(pool * 5 // 2)
    C.ok(code == grpc.StatusCode.RESOURCE_EXHAUSTED and
         "largest group's pool is %d bytes" % (2 * pool) in det,
         "4 KV heads over 3 ranks: a budget of 2.5 pools is refused (%s '%s')" % (code, det))
    code, ev = run(2 * pool)
    fin = ev[-1].finished if code == grpc.StatusCode.OK and ev[-1].HasField("finished") else None
    C.ok(fin is not None and fin.reason == pb.FINISH_REASON_LENGTH and
         fin.memory.budget_bytes == 2 * pool and fin.memory.bytes <= 2 * pool,
         "a budget of 2 pools runs on the three ranks (%s)" %
         str(fin and (fin.reason, fin.memory.budget_bytes, fin.memory.bytes) or code))
    srv.stop()


def nan_logits():
    """A model whose logits are all NaN (rand_gguf --nan 1): each request ends with an error
    naming the logits, and the worker goes on serving (the samplers had streamed id 0 every
    step as if it were a token)."""
    model = os.path.join(TMP, "nan.gguf")
    subprocess.run([RAND_GGUF, model, "--nan", "1"], check=True)
    srv = serving.Server(QEVICT, model, os.path.join(TMP, "state-nan"), workers=1).start()
    gen, md = tenant_gen(srv, "nan")
    for policy in ("full", "qevict"):
        req = pb.GenerateRequest(max_tokens=8, ignore_eos=True)
        req.prompt.token_ids.ids.extend(range(3, 200))
        req.policy.name = policy
        if policy != "full":
            req.budget.fraction = 0.9
        ev = list(gen.Generate(req, metadata=md, timeout=60))
        fin = ev[-1].finished if ev and ev[-1].HasField("finished") else None
        toks = sum(len(e.tokens.ids) for e in ev if e.HasField("tokens"))
        C.ok(fin is not None and fin.reason == pb.FINISH_REASON_ERROR and toks == 0 and
             "hold NaN, +inf or only -inf" in fin.error,
             "%s over NaN logits: no token, an error (%s)" %
             (policy, str(fin and (fin.reason, fin.error) or ev)))
    C.ok(srv.metric('qevict_workers', state="up") == 1, "the worker still serves")
    srv.stop()


def main():
    nan_logits()
    uneven_tp()
    model = os.path.join(TMP, "long.gguf")
    subprocess.run([RAND_GGUF, model, "--ctx", "40000", "--layers", "1"], check=True)
    srv = serving.Server(QEVICT, model, os.path.join(TMP, "state"), workers=1,
                         extra=["--pool-bytes", "1G", "--max-seqs", "4"]).start()
    opts = [("grpc.max_send_message_length", 64 << 20)]
    md = tenant_md(srv, grpc.insecure_channel(srv.addr, options=opts), "long")
    rng = random.Random(5)
    req = pb.GenerateRequest(max_tokens=4, ignore_eos=True)
    req.prompt.token_ids.ids.extend(rng.randrange(3, 267) for _ in range(N_PROMPT))
    req.policy.name = "qevict"
    req.budget.fraction = 0.1
    C.ok(req.ByteSize() > N_PROMPT, "the request is %d bytes" % req.ByteSize())
    sub = pbg.GenerationStub(grpc.insecure_channel(srv.addr, options=opts))
    rid = sub.Submit(req, metadata=md, timeout=60).request_id
    C.ok(bool(rid), "Submit of a %d-token prompt accepted: %s" % (N_PROMPT, rid))
    got = [None, None]

    def watch(k):
        st = pbg.GenerationStub(grpc.insecure_channel(srv.addr))
        got[k] = list(st.Watch(pb.WatchRequest(request_id=rid), metadata=md, timeout=900))

    ts = [threading.Thread(target=watch, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(900)
    ev = got[0] or []
    fin = ev[-1].finished if ev and ev[-1].HasField("finished") else None
    C.ok(fin is not None and fin.reason == pb.FINISH_REASON_LENGTH and
         fin.usage.prompt_tokens == N_PROMPT and fin.usage.completion_tokens == 4,
         "the job finished: %s" % str(fin and (fin.reason, fin.usage.prompt_tokens,
                                                 fin.usage.completion_tokens)))
    C.ok(fin is not None and 0 < fin.memory.bytes <= fin.memory.budget_bytes and
         fin.memory.windows_evicted + fin.memory.windows_int2 > 0,
         "its KV stayed within its 10%% budget: %s of %s bytes" %
         (fin and fin.memory.bytes, fin and fin.memory.budget_bytes))
    C.ok(got[0] == got[1], "a second client watched the same events")
    srv.stop()
    rc = C.done()
    if rc:
        print(srv.tail(4000))
    return rc


if __name__ == "__main__":
    sys.exit(main())
