#!/usr/bin/python3
"""test_tls: the gRPC port over TLS. Certificates are made at test time with the openssl CLI (a
test CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and a second,
unrelated CA). `qevict serve --tls-cert/--tls-key` (stories260K, one CPU worker) is driven by
Python grpcio and by `qevict submit`/`tenant`; then `--tls-client-ca` (client certificates
required); then /metrics and /healthz over TLS (`--metrics-tls`: Python's ssl and http.client,
with and without client certificates); then the scheduler-worker link over mutual TLS
(`qevict sched --worker-tls-*` and `qevict worker --tls-*` as separate processes on TCP, with
workers that must be refused); then the configuration errors of both sides.
usage: test_tls.py QEVICT_BINARY   (exit 77 = skipped)"""
import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving  # noqa: E402

grpc = serving.need_grpc()
QEVICT = os.path.abspath(sys.argv[1])
STORIES = serving.stories_path()
if not shutil.which("openssl"):
    print("SKIP: the openssl command is absent (Debian package openssl)")
    sys.exit(77)

TMP = serving.tmpdir()
pb, pbg, _, _ = serving.load_stubs(TMP)  # qevict.proto messages and their grpc stubs
C = serving.Checks()


def path(name):
    return os.path.join(TMP, name)


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True)


def make_ca(name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", path(name + ".key"), "-out", path(name + ".pem"), "-days", "2",
            "-subj", "/CN=qevict test " + name, "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def make_leaf(name, ca, ext):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", path(name + ".key"), "-out", path(name + ".csr"), "-subj", "/CN=" + name)
    with open(path(name + ".ext"), "w") as f:
        f.write(ext)
    openssl("x509", "-req", "-in", path(name + ".csr"), "-CA", path(ca + ".pem"), "-CAkey",
            path(ca + ".key"), "-CAcreateserial", "-out", path(name + ".pem"), "-days", "2",
            "-extfile", path(name + ".ext"))


def read(name):
    with open(path(name), "rb") as f:
        return f.read()


def channel(addr, ca=None, client=None, plain=False):
    if plain:
        return grpc.insecure_channel(addr)
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca + ".pem"),
        private_key=read(client + ".key") if client else None,
        certificate_chain=read(client + ".pem") if client else None)
    return grpc.secure_channel(addr, creds)


def code_of(fn):
    try:
        fn()
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def generate(ch, key, n=24):
    """A Generate stream's events (raises grpc.RpcError)."""
    req = pb.GenerateRequest(max_tokens=n, ignore_eos=True)
    req.prompt.text = "Once upon a time"
    return list(pbg.GenerationStub(ch).Generate(req, metadata=(("authorization", "Bearer " + key),),
                                                 timeout=60))


def cli(*args, env=None):
    e = dict(os.environ)
    e.pop("QEVICT_TLS_CA", None)
    e.update(env or {})
    return subprocess.run([QEVICT] + list(args), capture_output=True, text=True, env=e,
                          timeout=120)


def set_tenant(ch, admin_key):
    """Tenant t1 (1 GiB) made over the channel ch with the admin key; its API key."""
    r = pb.SetTenantRequest()
    r.tenant.id, r.tenant.kv_quota_bytes = "t1", 1 << 30
    md = (("authorization", "Bearer " + admin_key),)
    return pbg.AdminStub(ch).SetTenant(r, metadata=md, timeout=30).api_key


def new_tenant(srv, ca, client=None):
    return set_tenant(channel(srv.addr, ca, client), srv.admin_key())


def test_tls_server():
    srv = serving.Server(QEVICT, STORIES, path("state-tls"), workers=1,
                         extra=["--tls-cert", path("server.pem"), "--tls-key", path("server.key")])
    # the readiness probe reads /metrics (plain HTTP): the gRPC port alone speaks TLS
    srv.start()
    key = new_tenant(srv, "ca")
    C.ok(key.startswith("qk_"), "SetTenant over TLS (grpcio, the test CA as root)")
    ev = generate(channel(srv.addr, "ca"), key)
    fin = ev[-1].finished if ev and ev[-1].HasField("finished") else None
    C.ok(fin is not None and fin.usage.completion_tokens == 24,
         "Generate over TLS: 24 tokens and Finished")
    code = code_of(lambda: generate(channel(srv.addr, plain=True), key))
    C.ok(code == grpc.StatusCode.UNAVAILABLE, "a plaintext client is refused: %s" % code)
    code = code_of(lambda: generate(channel(srv.addr, "otherca"), key))
    C.ok(code == grpc.StatusCode.UNAVAILABLE, "a client trusting another CA is refused: %s" % code)
    sub = ["submit", "--server", srv.addr, "--key", key, "--prompt", "Once upon a time", "-n",
           "16", "--ignore-eos", "--json"]
    r = cli(*sub, "--tls-ca", path("ca.pem"))
    C.ok(r.returncode == 0 and '"completion_tokens":16' in r.stdout.replace(" ", ""),
         "qevict submit --tls-ca: exit %d" % r.returncode)
    r = cli(*sub, env={"QEVICT_TLS_CA": path("ca.pem")})
    C.ok(r.returncode == 0, "qevict submit with $QEVICT_TLS_CA: exit %d" % r.returncode)
    r = cli(*sub, "--tls-ca", path("ca.pem"), "--tls-server-name", "localhost")
    C.ok(r.returncode == 0, "--tls-server-name localhost (in the certificate): exit %d"
         % r.returncode)
    r = cli(*sub, "--tls-ca", path("ca.pem"), "--tls-server-name", "other.example")
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr,
         "--tls-server-name not in the certificate: exit %d, %s" % (r.returncode,
                                                                    r.stderr.strip()[-120:]))
    r = cli(*sub, "--tls", env={"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": path("ca.pem")})
    C.ok(r.returncode == 0, "--tls with the default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH "
         "= the test CA): exit %d" % r.returncode)
    r = cli(*sub, "--tls", env={"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": path("otherca.pem")})
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr,
         "--tls with default roots that do not hold the test CA: exit %d" % r.returncode)
    r = cli(*sub)
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr,
         "qevict submit without TLS: exit %d, %s" % (r.returncode, r.stderr.strip()[-120:]))
    r = cli(*sub, "--tls-ca", path("otherca.pem"))
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr,
         "qevict submit trusting another CA: exit %d" % r.returncode)
    r = cli("tenant", "get", "t1", "--server", srv.addr, "--admin-key-file",
            os.path.join(path("state-tls"), "admin.key"), "--tls-ca", path("ca.pem"), "--json")
    C.ok(r.returncode == 0 and '"t1"' in r.stdout, "qevict tenant get over TLS: exit %d"
         % r.returncode)
    r = cli("tenant", "--server", srv.addr, "--json", "--admin-key-file",
            os.path.join(path("state-tls"), "admin.key"), "--tls-ca", path("ca.pem"), "get", "t1")
    C.ok(r.returncode == 0 and '"t1"' in r.stdout, "qevict tenant with its options before the "
         "verb: exit %d, %s" % (r.returncode, r.stderr.strip()[-120:]))
    test_client_errors(sub)
    srv.stop()


def test_client_errors(sub):
    cases = [
        ("--tls-ca of a missing file", ["--tls-ca", path("nosuch.pem")], "--tls-ca"),
        ("--tls-ca of a text file that is not PEM", ["--tls-ca", path("notpem.txt")],
         "no PEM"),
        ("--tls-ca of a model file", ["--tls-ca", STORIES], "larger than 1 MiB"),
        ("--tls-ca of a key, not a certificate", ["--tls-ca", path("ca.key")], "CERTIFICATE"),
        ("--tls-cert without --tls-key", ["--tls-cert", path("client.pem")], "--tls-key"),
        ("--tls-key of a certificate", ["--tls-cert", path("client.pem"), "--tls-key",
                                        path("client.pem")], "PRIVATE KEY"),
        ("an empty --tls-ca", ["--tls-ca", path("empty.pem")], "empty"),
        # (gRPC had said "empty address list", exit 1)
        ("--tls-key of another certificate", ["--tls-cert", path("client.pem"), "--tls-key",
                                              path("server.key")],
         "server.key: the private key does not match the certificate in"),
    ]
    for what, extra, want in cases:
        r = cli(*sub, *extra)
        C.ok(r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr,
             "client: %s: exit %d, %s" % (what, r.returncode, r.stderr.strip()[-140:]))
    r = cli(*sub, "--tls-ca", path("ca.pem"), env={"QEVICT_TLS_CA": path("nosuch.pem")})
    C.ok(r.returncode == 0, "--tls-ca wins over $QEVICT_TLS_CA: exit %d" % r.returncode)
    r = cli(*sub, env={"QEVICT_TLS_CA": path("nosuch.pem")})
    C.ok(r.returncode == 2 and "QEVICT_TLS_CA" in r.stderr,
         "a missing $QEVICT_TLS_CA file: exit %d, %s" % (r.returncode, r.stderr.strip()[-120:]))


def test_mtls_server():
    srv = serving.Server(QEVICT, STORIES, path("state-mtls"), workers=1,
                         extra=["--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
                                "--tls-client-ca", path("ca.pem")])
    srv.start()
    key = new_tenant(srv, "ca", "client")
    ev = generate(channel(srv.addr, "ca", "client"), key)
    C.ok(ev and ev[-1].HasField("finished"), "mutual TLS: a client with a certificate of the CA")
    code = code_of(lambda: generate(channel(srv.addr, "ca"), key))
    C.ok(code == grpc.StatusCode.UNAVAILABLE, "mutual TLS: no client certificate: %s" % code)
    code = code_of(lambda: generate(channel(srv.addr, "ca", "stranger"), key))
    C.ok(code == grpc.StatusCode.UNAVAILABLE,
         "mutual TLS: a client certificate of another CA: %s" % code)
    sub = ["submit", "--server", srv.addr, "--key", key, "--prompt", "hi", "-n", "8",
           "--ignore-eos", "--tls-ca", path("ca.pem")]
    r = cli(*sub, "--tls-cert", path("client.pem"), "--tls-key", path("client.key"))
    C.ok(r.returncode == 0, "qevict submit --tls-cert/--tls-key under mutual TLS: exit %d"
         % r.returncode)
    r = cli(*sub)
    C.ok(r.returncode == 1 and "UNAVAILABLE" in r.stderr,
         "qevict submit without a client certificate: exit %d" % r.returncode)
    srv.stop()


def ssl_ctx(ca, client=None):
    ctx = ssl.create_default_context(cafile=path(ca + ".pem"))
    if client:
        ctx.load_cert_chain(path(client + ".pem"), path(client + ".key"))
    return ctx


def https_get(port, ctx, target="/metrics", conn=None):
    """(status, body) of one GET; raises OSError (ssl.SSLError among them) when refused."""
    c = conn or http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    c.request("GET", target)
    r = c.getresponse()
    return r.status, r.read().decode()


def refused(fn):
    try:
        fn()
        return "served"
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__


def test_metrics_tls():
    ctx = ssl_ctx("ca")
    srv = serving.Server(QEVICT, STORIES, path("state-mtls-metrics"), workers=1, metrics_ssl=ctx,
                         extra=["--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
                                "--metrics-tls"])
    srv.start()  # waits for the worker through /metrics over TLS
    st, body = https_get(srv.mport, ctx)
    C.ok(st == 200 and 'qevict_workers{state="up"} 1' in body,
         "--metrics-tls: /metrics over TLS (%d, %d bytes)" % (st, len(body)))
    conn = http.client.HTTPSConnection("127.0.0.1", srv.mport, context=ctx, timeout=10)
    sts = [https_get(srv.mport, ctx, t, conn)[0] for t in ("/healthz", "/metrics", "/nosuch")]
    C.ok(sts == [200, 200, 404], "three requests on one TLS connection (keep-alive): %s" % sts)
    try:  # several records, more than the server's buffer
        conn.request("GET", "/healthz", body=b"b" * 60000)
        r = conn.getresponse()
        got = "%d %r" % (r.status, r.read())
    except (OSError, http.client.HTTPException) as e:
        got = type(e).__name__
    C.ok(got == "200 b'ok\\n'", "a request with a 60,000-byte body over TLS answered: %s" % got)
    conn.close()
    why = refused(lambda: plain_get(srv.mport))
    C.ok(why != "served", "plain HTTP to the TLS metrics port is refused (%s)" % why)
    why = refused(lambda: https_get(srv.mport, ssl_ctx("otherca")))
    C.ok(why != "served", "a scraper trusting another CA is refused (%s)" % why)
    with socket.create_connection(("127.0.0.1", srv.mport), timeout=10) as raw:
        raw.sendall(b"\x16\x03\x01\x00\x05garbage-not-a-handshake" * 40)
        try:
            raw.recv(4096)
        except OSError:
            pass
    st, _ = https_get(srv.mport, ctx)
    C.ok(st == 200, "after a connection of garbage records, /metrics still served: %d" % st)
    out, how = trickle(srv.mport, ctx, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    C.ok(out.count(b"HTTP/1.1 200") == 2 and how == "close_notify",
         "the handshake and two pipelined requests sent a byte at a time: both answered "
         "(%d bytes), then the session ended by %s" % (len(out), how))
    srv.stop()
    srv = serving.Server(QEVICT, STORIES, path("state-mmtls-metrics"), workers=1,
                         metrics_ssl=ssl_ctx("ca", "client"),
                         extra=["--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
                                "--tls-client-ca", path("ca.pem"), "--metrics-tls"])
    srv.start()
    st, _ = https_get(srv.mport, ssl_ctx("ca", "client"))
    C.ok(st == 200, "--metrics-tls under mutual TLS: a scraper with a client certificate: %d" % st)
    reused = resume(srv.mport, ssl_ctx("ca", "client"))
    C.ok(reused == (True, 200), "mutual TLS metrics: a second connection resumes the first's "
         "session and is served: %s" % (reused,))
    why = refused(lambda: https_get(srv.mport, ctx))
    C.ok(why != "served", "mutual TLS metrics: no client certificate is refused (%s)" % why)
    why = refused(lambda: https_get(srv.mport, ssl_ctx("ca", "stranger")))
    C.ok(why != "served", "mutual TLS metrics: a certificate of another CA is refused (%s)" % why)
    srv.stop()


def trickle(port, ctx, request):
    """Runs TLS over a raw socket through memory BIOs, sending every byte of the client's records
    in its own TCP segment; returns the plaintext received and how the session ended
    ("close_notify", or "eof" when the socket closed without it)."""
    inc, outg = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, outg, server_hostname="127.0.0.1")
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_all():
        for b in outg.read():
            sock.sendall(bytes([b]))

    def pump(step):
        while True:
            try:
                return step()
            except ssl.SSLWantReadError:
                send_all()
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed before the step ended")
                inc.write(data)
    pump(obj.do_handshake)
    obj.write(request)
    send_all()
    got, how = b"", "eof"
    while True:
        try:
            chunk = pump(lambda: obj.read(65536))
        except ssl.SSLZeroReturnError:
            how = "close_notify"
            break
        except ConnectionError:
            break
        if not chunk:  # (SSLObject.read gives b"" once the close_notify is in)
            how = "close_notify"
            break
        got += chunk
    sock.close()
    return got, how


def resume(port, ctx):
    """(session reused, status) of a GET on a connection resuming a first one's session."""
    def get(session=None):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            try:
                chunk = s.recv(4096)
            except ssl.SSLZeroReturnError:
                break
            if not chunk:
                break
            data += chunk
        sess, again = s.session, s.session_reused
        s.close()
        return sess, again, int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0
    try:
        sess, _, _ = get()
        _, again, status = get(sess)
        return again, status
    except OSError as e:
        return type(e).__name__


def plain_get(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read()


def config_error(who, what, args, want, code, timeout):
    """A process with a TLS misconfiguration must exit non-zero with `want` in its message."""
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        C.ok(False, "%s: %s: still running after %d s" % (who, what, timeout))
        return
    ok = r.returncode != 0 and (code is None or r.returncode == code) and want in r.stderr
    C.ok(ok and "Sanitizer" not in r.stderr, "%s: %s: exit %d, %s" %
         (who, what, r.returncode, r.stderr.strip().splitlines()[-1][-150:] if r.stderr else ""))


def server_error(what, extra, want, code=None):
    """`qevict sched` with a TLS misconfiguration."""
    args = [QEVICT, "sched", "--model", STORIES, "--state-dir", path("state-bad"), "--listen",
            "127.0.0.1:%d" % serving.free_port(), "--metrics-listen", "",
            "--worker-listen", "unix:" + path("w.sock")] + extra
    config_error("server", what, args, want, code, 30)


def test_server_errors():
    cert, key = path("server.pem"), path("server.key")
    server_error("--tls-cert without --tls-key", ["--tls-cert", cert], "--tls-key", 2)
    server_error("--tls-client-ca alone", ["--tls-client-ca", path("ca.pem")], "--tls-cert", 2)
    server_error("a missing certificate file", ["--tls-cert", path("nosuch.pem"), "--tls-key",
                                                key], "--tls-cert")
    server_error("a certificate that is not PEM", ["--tls-cert", path("notpem.txt"), "--tls-key",
                                                   key], "no PEM CERTIFICATE")
    server_error("a key file holding a certificate", ["--tls-cert", cert, "--tls-key", cert],
                 "PRIVATE KEY")
    # (gRPC's own refusal had named neither file: "Invalid private key")
    server_error("a key of another certificate", ["--tls-cert", cert, "--tls-key",
                                                  path("client.key")],
                 "client.key: the private key does not match the certificate in")
    server_error("a client CA file that is not PEM", ["--tls-cert", cert, "--tls-key", key,
                                                      "--tls-client-ca", STORIES],
                 "--tls-client-ca '")
    server_error("--metrics-tls without --tls-cert", ["--metrics-tls"], "--metrics-tls needs", 2)
    server_error("--metrics-tls with no metrics endpoint", ["--tls-cert", cert, "--tls-key", key,
                                                            "--metrics-tls"], "no metrics", 2)
    r = subprocess.run([QEVICT, "worker", "--model", STORIES, "--metrics-tls"],
                       capture_output=True, text=True, timeout=60)
    C.ok(r.returncode == 2 and "scheduler option" in r.stderr,
         "qevict worker --metrics-tls: exit %d" % r.returncode)
    r = subprocess.run([QEVICT, "serve", "--model", STORIES, "--tls-key", key],
                       capture_output=True, text=True, timeout=60)
    C.ok(r.returncode == 2 and "--tls-cert" in r.stderr,
         "qevict serve --tls-key alone: exit %d" % r.returncode)
    r = subprocess.run([QEVICT, "worker", "--model", STORIES, "--tls-client-ca", cert],
                       capture_output=True, text=True, timeout=60)
    C.ok(r.returncode == 2 and "scheduler option" in r.stderr,
         "qevict worker --tls-client-ca: exit %d" % r.returncode)

class Proc:
    """A qevict process with its log file, killed at the end."""

    def __init__(self, name, args):
        self.log = path(name + ".log")
        self.logf = open(self.log, "wb")
        env = dict(os.environ, QEVICT_LOG="info")
        self.proc = subprocess.Popen([QEVICT] + args, stdout=self.logf, stderr=self.logf,
                                     start_new_session=True, env=env)

    def text(self):
        with open(self.log, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, needle, timeout=60):
        """True once needle is in the log (False after timeout or when the process exits
        without it)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.text():
                return True
            if self.proc.poll() is not None:
                return needle in self.text()
            time.sleep(0.1)
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def link_worker(name, wport, tls, group=None):
    args = ["worker", "--model", STORIES, "--scheduler", "127.0.0.1:%d" % wport, "--group",
            group or name, "--threads", "1", "--max-seqs", "4"]
    return Proc(name, args + tls)


def up_groups(mport):
    try:
        body = plain_get(mport).decode()
    except OSError:
        return -1
    for line in body.splitlines():
        if line.startswith('qevict_workers{state="up"}'):
            return int(float(line.split()[-1]))
    return 0


def bad_worker(sched, wport, mport, name, tls, worker_says, sched_says):
    """A worker the link must refuse: its log and the scheduler's say why; no group comes up."""
    w = link_worker(name, wport, tls)
    got_w = w.wait_for(worker_says)
    got_s = sched.wait_for(sched_says, timeout=30)
    time.sleep(0.5)
    ups = up_groups(mport)
    w.stop()
    lines = [ln for ln in w.text().splitlines() if "scheduler connection" in ln]
    C.ok(got_w and got_s and ups == 1,
         "worker link: %s: refused (worker: %s; scheduler says %r: %s; groups up %d)"
         % (name, lines[0][-150:] if lines else "no line", sched_says, got_s, ups))


def test_worker_tls():
    gport, mport, wport = serving.free_ports(3)
    ready = path("link.ready")
    sched = Proc("link-sched", [
        "sched", "--model", STORIES, "--state-dir", path("state-link"), "--listen",
        "127.0.0.1:%d" % gport, "--metrics-listen", "127.0.0.1:%d" % mport, "--worker-listen",
        "127.0.0.1:%d" % wport, "--ready-file", ready, "--worker-tls-cert", path("server.pem"),
        "--worker-tls-key", path("server.key"), "--worker-tls-ca", path("ca.pem")])
    good = ["--tls-ca", path("ca.pem"), "--tls-cert", path("client.pem"), "--tls-key",
            path("client.key")]
    w = link_worker("link-good", wport, good, group="g0")
    deadline = time.time() + 120
    while not os.path.exists(ready) and time.time() < deadline and sched.proc.poll() is None:
        time.sleep(0.1)
    said = [ln for ln in sched.text().splitlines() if "workers on" in ln] or ["nothing"]
    C.ok(os.path.exists(ready) and "over mutual TLS" in said[0],
         "worker link over mutual TLS: the group registered (scheduler: %s)" % said[0][-110:])
    said = [ln for ln in sched.text().splitlines() if "connected from" in ln] or ["nothing"]
    C.ok("(CN=client)" in said[0], "the scheduler names the worker by its certificate's CN: %s"
         % said[0][-100:])
    # (this scheduler's gRPC port is plaintext by design: the test's subject is its worker link)
    gaddr = "127.0.0.1:%d" % gport
    with open(os.path.join(path("state-link"), "admin.key")) as f:
        key = set_tenant(channel(gaddr, plain=True), f.read().strip())
    ev = generate(channel(gaddr, plain=True), key)
    fin = ev[-1].finished if ev and ev[-1].HasField("finished") else None
    C.ok(fin is not None and fin.usage.completion_tokens == 24,
         "Generate served by a worker over the TLS link: 24 tokens and Finished")
    bad_worker(sched, wport, mport, "link-plain", [], "closed during the handshake",
               "does not speak TLS")
    bad_worker(sched, wport, mport, "link-otherca", ["--tls-ca", path("otherca.pem"),
                                                     "--tls-cert", path("client.pem"),
                                                     "--tls-key", path("client.key")],
               "certificate verify failed", "alert unknown ca")
    bad_worker(sched, wport, mport, "link-stranger", ["--tls-ca", path("ca.pem"), "--tls-cert",
                                                      path("stranger.pem"), "--tls-key",
                                                      path("stranger.key")],
               "alert unknown ca", "unable to get local issuer certificate")
    bad_worker(sched, wport, mport, "link-name", good + ["--tls-server-name", "other.example"],
               "hostname mismatch", "alert bad certificate")
    ev = generate(channel(gaddr, plain=True), key)
    C.ok(ev and ev[-1].HasField("finished"), "the good worker still serves after the refusals")
    body = plain_get(mport).decode()
    tls = [ln for ln in body.splitlines()
           if ln.startswith('qevict_worker_connections_refused_total{reason="tls"}')]
    n = int(float(tls[0].split()[-1])) if tls else 0
    C.ok(n >= 4, "/metrics counts the refused worker connections: %s" % (tls or "none"))
    w.stop()
    sched.stop()


def worker_error(what, extra, want, code=None):
    """`qevict worker` with a link TLS misconfiguration."""
    args = [QEVICT, "worker", "--model", STORIES, "--scheduler", "127.0.0.1:1"] + extra
    config_error("worker", what, args, want, code, 60)


def test_link_errors():
    cert, key, ca = path("server.pem"), path("server.key"), path("ca.pem")
    ccert, ckey = path("client.pem"), path("client.key")
    server_error("--worker-tls-ca alone", ["--worker-tls-ca", ca], "give all of", 2)
    server_error("--worker-tls-* of a CA that is not PEM", [
        "--worker-tls-cert", cert, "--worker-tls-key", key, "--worker-tls-ca", path("notpem.txt")],
        "--worker-tls-ca '")
    server_error("--worker-tls-key of another certificate", [
        "--worker-tls-cert", cert, "--worker-tls-key", ckey, "--worker-tls-ca", ca], "mismatch")
    # (a passphrase-protected key: OpenSSL had prompted on the terminal and waited; without one
    # it said "processing error")
    enc = path("enc.key")
    openssl("pkcs8", "-topk8", "-in", key, "-out", enc, "-passout", "pass:x")
    server_error("--worker-tls-key encrypted", [
        "--worker-tls-cert", cert, "--worker-tls-key", enc, "--worker-tls-ca", ca],
        "the private key is encrypted")
    worker_error("--tls-key encrypted", ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", enc],
                 "the private key is encrypted")
    worker_error("--tls-ca without a client certificate", ["--tls-ca", ca], "--tls-cert", 2)
    worker_error("--tls-cert without --tls-ca", ["--tls-cert", ccert, "--tls-key", ckey],
                 "need --tls-ca", 2)
    worker_error("--tls-server-name without --tls-ca", ["--tls-server-name", "x"],
                 "need --tls-ca", 2)
    worker_error("--tls-ca of a missing file", ["--tls-ca", path("nosuch.pem"), "--tls-cert",
                                                ccert, "--tls-key", ckey], "--tls-ca '")
    worker_error("--tls-key of a certificate", ["--tls-ca", ca, "--tls-cert", ccert, "--tls-key",
                                                ccert], "PRIVATE KEY")
    worker_error("--tls-key of another certificate", ["--tls-ca", ca, "--tls-cert", ccert,
                                                      "--tls-key", key], "mismatch")
    r = subprocess.run([QEVICT, "serve", "--model", STORIES, "--worker-tls-ca", ca],
                       capture_output=True, text=True, timeout=60)
    C.ok(r.returncode == 2 and "scheduler option" in r.stderr,
         "qevict serve --worker-tls-ca (its workers use a Unix socket): exit %d" % r.returncode)


def main():
    make_ca("ca")
    make_ca("otherca")
    make_leaf("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth\n")
    make_leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
    make_leaf("stranger", "otherca", "extendedKeyUsage=clientAuth\n")
    open(path("empty.pem"), "w").close()
    with open(path("notpem.txt"), "w") as f:
        f.write("-----BEGIN nothing\nhello\n")
    test_tls_server()
    test_mtls_server()
    test_metrics_tls()
    test_server_errors()
    test_worker_tls()
    test_link_errors()
    rc = C.done()
    shutil.rmtree(TMP, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
