"""serving: helpers of the serving integration tests. They start the real system (`qevict serve`,
a scheduler and worker processes on loopback), talk to it with Python grpcio through stubs
generated from proto/*.proto at test time (no code of ours on the client side), and read its
metrics over HTTP. Every wait has a timeout; every process is stopped at exit."""
import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_stubs(tmp):
    """Generates the Python stubs of qevict.proto and health.proto into tmp and imports them."""
    from grpc_tools import protoc  # Debian python3-grpc-tools
    out = os.path.join(tmp, "stubs")
    os.makedirs(out, exist_ok=True)
    proto = os.path.join(ROOT, "proto")
    rc = protoc.main(["protoc", "-I", proto, "--python_out=" + out, "--grpc_python_out=" + out,
                      os.path.join(proto, "qevict.proto"), os.path.join(proto, "health.proto")])
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    sys.path.insert(0, out)
    import qevict_pb2, qevict_pb2_grpc, health_pb2, health_pb2_grpc  # noqa: E401
    return qevict_pb2, qevict_pb2_grpc, health_pb2, health_pb2_grpc


def need_grpc():
    """The grpc module, or exit 77 (skipped) where python3-grpcio is not installed."""
    try:
        import grpc  # Debian python3-grpcio
        return grpc
    except ImportError:
        print("SKIP: python3-grpcio is not installed")
        sys.exit(77)


def stories_path():
    """../shared/models/stories260K.gguf ($QE_SHARED_MODELS), or exit 77 where it is absent."""
    p = os.path.join(os.environ.get("QE_SHARED_MODELS", os.path.join(ROOT, "..", "shared",
                                                                     "models")),
                     "stories260K.gguf")
    if not os.path.exists(p):
        print("SKIP: %s is absent" % p)
        sys.exit(77)
    return p


def free_ports(n):
    """n distinct loopback ports that were free a moment ago (all held while they are picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


def series_value(text, name, **labels):
    """The value of one series of a /metrics scrape's text (None if absent)."""
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, val = line.rsplit(" ", 1)
        if "{" in key:
            nm, rest = key.split("{", 1)
            got = ",".join(sorted(rest.rstrip("}").split(",")))
        else:
            nm, got = key, ""
        if nm == name and got == want:
            return float(val)
    return None


class Server:
    """`qevict serve` in a process group of its own, with its ports and state directory."""

    def __init__(self, qevict, model, state_dir, workers=1, extra=(), log=None, metrics_ssl=None,
                 env=None, blocked=()):
        """metrics_ssl: an ssl.SSLContext for a metrics endpoint served over TLS; env: variables
        set for the server (QEVICT_LOG); blocked: signals serve starts with blocked (as a
        launcher may leave them)."""
        self.blocked = tuple(blocked)
        self.qevict, self.model, self.state_dir = qevict, model, state_dir
        self.env = dict(os.environ, **env) if env else None
        self.metrics_ssl = metrics_ssl
        self.workers, self.extra = workers, list(extra)
        self.pick_ports()
        self.log = log or os.path.join(state_dir + ".log")
        self.proc = None
        atexit.register(self.stop)

    def pick_ports(self):
        self.port, self.mport = free_ports(2)
        self.addr = "127.0.0.1:%d" % self.port

    def start(self, timeout=120):
        """Starts and waits until ready; a port taken since it was picked (by a test running in
        parallel) makes it pick new ones and try again, up to three times."""
        for attempt in range(3):
            try:
                return self.start_once(timeout)
            except RuntimeError as e:
                taken = any(k in str(e) for k in ("cannot listen", "address already in use"))
                if attempt == 2 or not taken:
                    raise
                self.pick_ports()

    def launch(self):
        """Starts serve without waiting for it; returns its ready file's path."""
        ready = self.state_dir + ".ready"
        if os.path.exists(ready):
            os.unlink(ready)
        args = [self.qevict, "serve", "--model", self.model, "--listen", self.addr,
                "--metrics-listen", "127.0.0.1:%d" % self.mport, "--state-dir", self.state_dir,
                "--workers", str(self.workers), "--ready-file", ready] + self.extra
        self.logf = open(self.log, "ab")
        pre = (lambda: signal.pthread_sigmask(signal.SIG_BLOCK, self.blocked)) \
            if self.blocked else None
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=self.logf,
                                     start_new_session=True, env=self.env, preexec_fn=pre)
        return ready

    def start_once(self, timeout):
        ready = self.launch()
        deadline = time.time() + timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError("qevict serve exited: %s" % self.tail())
            if time.time() > deadline:
                raise RuntimeError("qevict serve not ready in %d s: %s" % (timeout, self.tail()))
            time.sleep(0.1)
        self.wait_groups(self.workers, timeout)
        return self

    def wait_groups(self, n, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics_text()
            for line in m.splitlines():
                if line.startswith('qevict_workers{state="up"}') and float(line.split()[-1]) >= n:
                    return
            time.sleep(0.2)
        raise RuntimeError("%d worker groups not up in %d s: %s" % (n, timeout, self.tail()))

    def admin_key(self):
        with open(os.path.join(self.state_dir, "admin.key")) as f:
            return f.read().strip()

    def metrics_text(self, tries=3):
        """One scrape ("" if three tries in a row failed: the server is gone or stuck)."""
        for _ in range(tries):
            try:
                scheme = "https" if self.metrics_ssl else "http"
                with urllib.request.urlopen("%s://127.0.0.1:%d/metrics" % (scheme, self.mport),
                                            timeout=10, context=self.metrics_ssl) as r:
                    return r.read().decode()
            except OSError:
                time.sleep(0.2)
        return ""

    def metric(self, name, **labels):
        """The value of one series of the current scrape (None if absent)."""
        return series_value(self.metrics_text(), name, **labels)

    def worker_pids(self, group):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f",
                              "qevict worker .*--group %s " % group],
                             capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def tail(self, n=3000):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


class Checks:
    """Collects failures; prints one line per check."""

    def __init__(self):
        self.failed = 0

    def ok(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failed += 1
        return cond

    def done(self):
        print("%s: %d failure(s)" % ("FAILED" if self.failed else "PASSED", self.failed))
        return 1 if self.failed else 0


def until(pred, timeout, poll=0.1):
    """Polls pred every poll seconds until it is true or timeout seconds have passed; returns its
    last value."""
    deadline = time.time() + timeout
    v = pred()
    while not v and time.time() < deadline:
        time.sleep(poll)
        v = pred()
    return v


def tmpdir():
    d = tempfile.mkdtemp(prefix="qevict-it-")
    return d
