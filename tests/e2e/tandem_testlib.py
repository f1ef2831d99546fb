"""Shared helpers for Tandem's end-to-end tests: real processes, real gRPC clients.

Python gRPC stubs are generated at test time from the project's protos with the system
protoc and grpc_python_plugin (Debian's protobuf-compiler-grpc), into a temporary directory.
Run with /usr/bin/python3 (Debian's python3-grpcio).
"""
import atexit
import hashlib
import hmac
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STUB_DIR = None
_SECRET = None
_KV_SECRET = None
INTERNAL_TOKEN_KEY = "x-tandem-internal"
WORKER_COMMANDS = ("prefill", "decode", "worker")


def cluster_secret():
    """(path, bytes) of a cluster secret file (--cluster-secret-file) shared by this test's
    clusters, so the test can call their workers directly as the router does."""
    global _SECRET
    if _SECRET is None:
        d = tempfile.mkdtemp(prefix="tandem-secret-")
        atexit.register(shutil.rmtree, d, True)
        path = os.path.join(d, "cluster.secret")
        secret = os.urandom(24).hex().encode()
        with open(path, "wb") as f:
            f.write(secret + b"\n")
        os.chmod(path, 0o600)
        _SECRET = (path, secret)
    return _SECRET


def kv_secret():
    """(path, bytes) of a KV secret file (--kv-secret-file) shared by this test's workers: a
    worker started by hand needs one (or --allow-unauthenticated-kv)."""
    global _KV_SECRET
    if _KV_SECRET is None:
        d = tempfile.mkdtemp(prefix="tandem-kv-secret-")
        atexit.register(shutil.rmtree, d, True)
        path = os.path.join(d, "kv.secret")
        secret = os.urandom(24).hex().encode()
        with open(path, "wb") as f:
            f.write(secret + b"\n")
        os.chmod(path, 0o600)
        _KV_SECRET = (path, secret)
    return _KV_SECRET


def with_kv_secret(args):
    """`args` of a `tandem` command; a worker command without KV flags gets kv_secret()'s file."""
    args = list(args)
    if args and args[0] in WORKER_COMMANDS and not any(
            a.startswith(("--kv-secret-file", "--allow-unauthenticated-kv")) for a in args):
        args += ["--kv-secret-file", kv_secret()[0]]
    return args


def internal_token(secret, method, at=None, nonce=None):
    """The token the router puts on a call to `method` ("/tandem.v1.Worker/Decode"), as
    common/rpc/call_auth.h defines it: v1.<unix ms>.<nonce hex>.<HMAC-SHA256 hex>."""
    ms = str(int((time.time() if at is None else at) * 1000))
    nonce_hex = (nonce or os.urandom(16)).hex()
    message = f"tandem internal rpc v1\n{method}\n{ms}\n{nonce_hex}".encode()
    mac = hmac.new(secret, message, hashlib.sha256).hexdigest()
    return f"v1.{ms}.{nonce_hex}.{mac}"


def internal_channel(address, secret=None):
    """A plaintext channel to a worker whose every call carries a fresh token of `secret`
    (default: cluster_secret()'s)."""
    import grpc
    secret = secret if secret is not None else cluster_secret()[1]

    class Tokens(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def _details(self, d):
            md = list(d.metadata or []) + [(INTERNAL_TOKEN_KEY, internal_token(secret, d.method))]
            return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

        def intercept_unary_unary(self, continuation, details, request):
            return continuation(self._details(details), request)

        def intercept_unary_stream(self, continuation, details, request):
            return continuation(self._details(details), request)

    return grpc.intercept_channel(grpc.insecure_channel(address), Tokens())


class _Details:
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def attempt_target(reservation, attempt):
    """What a router sends a prefill worker for `attempt` of a decode worker's reservation: a copy
    whose transfer_key is the attempt's own key (common/cluster/transfer_key.h: HMAC-SHA256 of the
    transfer key over a label and the attempt, little-endian), never the transfer key itself."""
    target = type(reservation)()
    target.CopyFrom(reservation)
    if reservation.transfer_key:
        label = b"tandem kvtransfer attempt key" + attempt.to_bytes(4, "little")
        target.transfer_key = hmac.new(reservation.transfer_key, label, hashlib.sha256).digest()
    return target


def load_stubs():
    """Generates and imports the tandem.v1 Python stubs; returns (generation_pb2, grpc module, ...)."""
    global _STUB_DIR
    if _STUB_DIR is None and os.environ.get("TANDEM_PY_STUBS"):
        # Stubs generated elsewhere (tests/gpu/pack_prebuilt.sh), for machines without protoc.
        _STUB_DIR = os.environ["TANDEM_PY_STUBS"]
        sys.path.insert(0, _STUB_DIR)
    if _STUB_DIR is None:
        _STUB_DIR = tempfile.mkdtemp(prefix="tandem-stubs-")
        atexit.register(shutil.rmtree, _STUB_DIR, True)
        protos = os.path.join(ROOT, "protos")
        files = [os.path.join("tandem", "v1", f) for f in sorted(os.listdir(os.path.join(protos, "tandem", "v1")))
                 if f.endswith(".proto")]
        subprocess.run(["protoc", f"--proto_path={protos}", f"--python_out={_STUB_DIR}",
                        f"--grpc_out={_STUB_DIR}", "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"]
                       + files, check=True, cwd=protos)
        sys.path.insert(0, _STUB_DIR)
    import grpc  # noqa: F401
    from tandem.v1 import common_pb2, generation_pb2, generation_pb2_grpc, sampling_pb2
    from tandem.v1 import worker_pb2, worker_pb2_grpc, router_admin_pb2, router_admin_pb2_grpc
    stubs = Stubs(common_pb2, generation_pb2, generation_pb2_grpc, sampling_pb2, worker_pb2,
                  worker_pb2_grpc)
    stubs.admin, stubs.admin_grpc = router_admin_pb2, router_admin_pb2_grpc
    return stubs


class Stubs:
    def __init__(self, common, gen, gen_grpc, sampling, worker, worker_grpc):
        self.common, self.gen, self.gen_grpc = common, gen, gen_grpc
        self.sampling, self.worker, self.worker_grpc = sampling, worker, worker_grpc


class Server:
    """A `tandem serve` process on a free loopback port."""

    def __init__(self, build_dir, *args, model=None, startup_timeout=60):
        self.tmp = tempfile.mkdtemp(prefix="tandem-serve-")
        self.port_file = os.path.join(self.tmp, "port")
        self.log_path = os.path.join(self.tmp, "serve.log")
        cmd = [os.path.join(build_dir, "bin", "tandem"), "serve", "--port", "0",
               "--port-file", self.port_file] + list(args)
        if not any(a.startswith(("--kv-cache-memory", "--num-kv-blocks")) for a in args):
            # The bundled models need far less than the 1 GiB default, which every engine
            # commits at startup (seconds per GiB on a VM, more under load).
            cmd += ["--kv-cache-memory", "128MiB"]
        if model:
            cmd += ["--model", model]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=popen_env(getattr(self, "_env", None)))
        deadline = time.time() + startup_timeout
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None:
                raise RuntimeError(f"tandem serve exited with {self.proc.returncode}:\n{self.logs()}")
            if time.time() > deadline:
                self.kill()
                raise RuntimeError(f"tandem serve did not start:\n{self.logs()}")
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())
        self.address = f"127.0.0.1:{self.port}"

    def logs(self):
        self.log.flush()
        return open(self.log_path, "rb").read().decode("utf-8", "replace")

    def terminate(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        shutil.rmtree(self.tmp, True)


class HttpServer(Server):
    """A `tandem serve` process with the OpenAI HTTP API on a free loopback port (http_port)."""

    def __init__(self, build_dir, *args, model=None):
        self.http_port_file = os.path.join(tempfile.mkdtemp(prefix="tandem-http-"), "http_port")
        super().__init__(build_dir, "--http-port", "0", "--http-port-file", self.http_port_file,
                         *args, model=model)
        deadline = time.time() + 60
        while not os.path.exists(self.http_port_file):
            check(time.time() < deadline and self.proc.poll() is None, f"no HTTP port:\n{self.logs()}")
            time.sleep(0.05)
        time.sleep(0.05)
        self.http_port = int(open(self.http_port_file).read())


def check(condition, message):
    if not condition:
        raise AssertionError(message)


WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the "
         "park one day her mom said we can go to the big tree and see the bird tom was happy "
         "because he had a red ball and a small dog").split()


def make_prompt(rng, min_words, max_words):
    n = rng.randint(min_words, max_words)
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize()


def generate(stubs, stub, timeout=120, **kwargs):
    """Runs one Generate call; returns {index: {"ids", "text", "final"}} and the first response."""
    sampling = kwargs.pop("sampling", {})
    request = stubs.gen.GenerateRequest(sampling=stubs.sampling.SamplingParams(**sampling), **kwargs)
    out = {}
    for r in stub.Generate(request, timeout=timeout):
        if r.HasField("chunk"):
            s = out.setdefault(r.chunk.index, {"ids": [], "text": "", "final": None})
            s["ids"].extend(r.chunk.token_ids)
            s["text"] += r.chunk.text
        else:
            s = out.setdefault(r.final.index, {"ids": [], "text": "", "final": None})
            s["final"] = r.final
    return out


def worker_stats(stubs, channel):
    """A worker's stats (`channel`: an internal_channel when the worker has a cluster secret)."""
    return stubs.worker_grpc.WorkerStub(channel).GetStats(stubs.worker.StatsRequest(), timeout=10)


def serve_stats(stubs, channel, metadata=None):
    """The stats of `tandem serve`'s one in-process worker (RouterAdmin: its port offers no
    Worker API)."""
    status = stubs.admin_grpc.RouterAdminStub(channel).GetClusterStatus(
        stubs.admin.ClusterStatusRequest(), timeout=10, metadata=metadata)
    return status.workers[0].stats


class Cluster(Server):
    """`tandem serve --prefill-workers N --decode-workers M`: worker processes on loopback and
    the router in the serve process. Knows its children's pids and ports."""

    def __init__(self, build_dir, prefill, decode, *args, env=None, **kwargs):
        self._env = env
        if "--cluster-secret-file" not in args:
            args = ("--cluster-secret-file", cluster_secret()[0]) + tuple(args)
        super().__init__(build_dir, "--prefill-workers", str(prefill), "--decode-workers",
                         str(decode), *args, **kwargs)

    def children(self):
        """{role: [(pid, port)]} from the supervisor's log lines."""
        out = {"prefill": [], "decode": []}
        for line in self.logs().splitlines():
            if "cluster_supervisor" in line and "started" in line and " worker pid " in line:
                words = line.split()
                role = words[words.index("worker") - 1]
                pid = int(words[words.index("pid") + 1])
                port = int(words[words.index("port") + 1])
                out[role] = [(p, q) for (p, q) in out[role] if q != port] + [(pid, port)]
        return out

    def worker_channels(self):
        """Channels to the workers that prove the cluster secret, as the router's do."""
        return {role: [internal_channel(f"127.0.0.1:{port}") for _, port in lst]
                for role, lst in self.children().items()}


def popen_env(extra):
    env = dict(os.environ)
    env.update(extra or {})
    return env


def kv_blocks_sent(metrics_port):
    """{transport: KV blocks sent} from a worker's /metrics (tandem_kv_transfer_blocks_total)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        m = re.match(r'tandem_kv_transfer_blocks_total\{(.*)\} (\S+)', line)
        if m and 'direction="send"' in m.group(1):
            transport = re.search(r'transport="([^"]*)"', m.group(1)).group(1)
            out[transport] = out.get(transport, 0) + float(m.group(2))
    return out


def cluster_status(stubs, channel):
    return stubs.admin_grpc.RouterAdminStub(channel).GetClusterStatus(
        stubs.admin.ClusterStatusRequest(), timeout=10)


def wait_no_leaks(stubs, channels, timeout=20):
    """Every worker reports zero KV blocks used by requests, nothing awaiting, held or in flight.
    A worker that does not answer yet (UNAVAILABLE: a supervisor still restarting it) counts as
    not done until the deadline."""
    import grpc
    deadline = time.time() + timeout
    while True:
        bad = []
        for ch in channels:
            try:
                s = worker_stats(stubs, ch)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                bad.append(f"unavailable: {e.details()}")
                continue
            if s.kv_blocks_used or s.awaiting_kv or s.kv_blocks_held or s.transfers_in_flight \
                    or s.running or s.waiting:
                bad.append(s)
        if not bad:
            return
        if time.time() > deadline:
            raise AssertionError(f"workers still hold resources: {bad}")
        time.sleep(0.1)
