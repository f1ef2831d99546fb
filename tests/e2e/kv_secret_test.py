#!/usr/bin/python3
"""The KV data path authenticated with a shared secret (--kv-secret-file, kvtransfer/auth.h):

1. `tandem serve --prefill-workers 1 --decode-workers 1` without KV flags makes a KV secret of its
   own (a 0600 file in its 0700 state directory) and starts its workers with it;
   `--kv-secret-file S` gives the same greedy output, and its prefill worker really sent the KV
   over the authenticated path (its kv transfer metrics: sends, no failures).
2. A prefill worker and a decode worker with different secrets (separate `tandem prefill`,
   `tandem decode`, `tandem router` processes): no KV moves between them; the prefill worker's
   transfer fails as `unauthenticated`, the decode worker logs the refusal naming the cause, and
   the request still ends OK with the same output (the router falls back to prefilling on the
   decode worker). The same when the decode worker runs without a secret
   (--allow-unauthenticated-kv, which it warns about): the sender refuses it.
3. A worker without --kv-secret-file does not start unless --allow-unauthenticated-kv is given;
   bad secret files are refused at startup with a clear message."""
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

from tandem_testlib import Cluster, check, generate, load_stubs

PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the "
          "park with her friends. One day her mom said that they could go to the big tree and see "
          "the bird that lived there. Lily was very happy because")
SAMPLING = dict(temperature=0, max_tokens=12)


def metric(port, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def run(stubs, address):
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))
    out = generate(stubs, stub, text=PROMPT, sampling=SAMPLING)
    check(out[0]["final"].usage.completion_tokens == SAMPLING["max_tokens"],
          f"{address}: {out[0]['final']}")
    return out[0]["ids"]


def wait_file(path, proc, log, what):
    deadline = time.time() + 90
    while not os.path.exists(path):
        check(time.time() < deadline and proc.poll() is None,
              f"{what} did not start: {open(log, 'rb').read()[-3000:]!r}")
        time.sleep(0.05)
    return int(open(path).read())


class Processes:
    def __init__(self, build_dir, d):
        self.exe, self.d, self.procs = os.path.join(build_dir, "bin", "tandem"), d, []

    def start(self, name, *args):
        """Starts `tandem <args>` with its gRPC (and /metrics) port files; returns the ports."""
        log = os.path.join(self.d, f"{name}.log")
        port_file, metrics_file = os.path.join(self.d, f"{name}.port"), None
        cmd = [self.exe, *args, "--port", "0", "--port-file", port_file]
        if args[0] != "router":
            metrics_file = os.path.join(self.d, f"{name}.metrics")
            cmd += ["--metrics-port=-1", f"--metrics-port-file={metrics_file}"]
        proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.procs.append(proc)
        port = wait_file(port_file, proc, log, name)
        return port, (wait_file(metrics_file, proc, log, name) if metrics_file else None)

    def log(self, name):
        return open(os.path.join(self.d, f"{name}.log"), "rb").read().decode("utf-8", "replace")

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs = []


def mismatched(build_dir, d, stubs, decode_secret_args, reference, label):
    """A prefill worker with secret `a`, a decode worker with `decode_secret_args`, a router."""
    ps = Processes(build_dir, d)
    try:
        _, prefill_metrics = ps.start(f"prefill-{label}", "prefill", "--kv-secret-file",
                                      os.path.join(d, "a.secret"))
        decode_port, decode_metrics = ps.start(f"decode-{label}", "decode", *decode_secret_args)
        prefill_port = int(open(os.path.join(d, f"prefill-{label}.port")).read())
        router_port, _ = ps.start(f"router-{label}", "router", "--prefill-addresses",
                                  f"127.0.0.1:{prefill_port}", "--decode-addresses",
                                  f"127.0.0.1:{decode_port}")
        ids = run(stubs, f"127.0.0.1:{router_port}")
        check(ids == reference, f"{label}: output {ids} differs from the reference {reference}")
        failed = metric(prefill_metrics, "tandem_kv_transfer_failures_total", direction="send",
                        reason="unauthenticated")
        sent = metric(prefill_metrics, "tandem_kv_transfer_size_bytes_count", direction="send")
        check(failed >= 1, f"{label}: no unauthenticated transfer failure on the prefill worker")
        check(sent == 0, f"{label}: {sent} transfers were sent to a decode worker with another secret")
        router_log = ps.log(f"router-{label}")
        check("failed authentication" in router_log or "authentication failed" in router_log,
              f"{label}: the router's log does not say why the prefill failed:\n{router_log[-3000:]}")
        refused = {side: metric(port, "tandem_kv_transfer_connections_refused_total",
                                reason="unauthenticated")
                   for side, port in (("prefill", prefill_metrics), ("decode", decode_metrics))}
        return ps.log(f"decode-{label}"), ps.log(f"prefill-{label}"), refused
    finally:
        ps.stop()


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    d = tempfile.mkdtemp(prefix="tandem-kv-secret-")
    for name, secret in (("a", "cluster-secret-number-one-0123456789"),
                         ("b", "another-cluster-secret-9876543210"), ("short", "tiny")):
        path = os.path.join(d, f"{name}.secret")
        with open(path, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)

    # 1. A default cluster makes its own secret; the same output with the operator's.
    with Cluster(build_dir, 1, 1) as plain:
        reference = run(stubs, plain.address)
        for role, lst in plain.children().items():
            args = open(f"/proc/{lst[0][0]}/cmdline", "rb").read().decode().split("\0")
            files = [a.split("=", 1)[1] for a in args if a.startswith("--kv-secret-file=")]
            check(len(files) == 1, f"{role} worker started without a KV secret: {args}")
            mode, dir_mode = os.stat(files[0]).st_mode & 0o777, \
                os.stat(os.path.dirname(files[0])).st_mode & 0o777
            check(mode == 0o600 and dir_mode == 0o700 and len(open(files[0]).read()) >= 32,
                  f"{role}: the KV secret {files[0]} is {oct(mode)} in a {oct(dir_mode)} directory")
    print("ok: a default cluster gives its workers a KV secret of its own (0600 in a 0700 dir)")
    metrics_file = os.path.join(d, "serve.metrics")
    with Cluster(build_dir, 1, 1, "--kv-secret-file", os.path.join(d, "a.secret"),
                 "--metrics-port=-1", f"--metrics-port-file={metrics_file}") as cluster:
        ids = run(stubs, cluster.address)
        check(ids == reference, f"with the secret: {ids} != without: {reference}")
        workers = dict(line.split() for line in open(metrics_file + ".workers").read().splitlines())
        port = int(workers["prefill"].rsplit(":", 1)[1])
        sent = metric(port, "tandem_kv_transfer_size_bytes_count", direction="send")
        failed = metric(port, "tandem_kv_transfer_failures_total", direction="send")
        check(sent >= 1 and failed == 0, f"prefill worker: {sent} transfers sent, {failed} failed")
    print(f"ok: a cluster with --kv-secret-file gives the same output ({len(ids)} tokens) and "
          f"moved the KV over the authenticated path")

    # 2. Another secret, or none, on the decode worker: no KV reaches it; the request completes.
    decode_log, _, refused = mismatched(build_dir, d, stubs,
                               ["--kv-secret-file", os.path.join(d, "b.secret")], reference,
                               "other-secret")
    check("kv transfer: refusing" in decode_log and
          "does not match this receiver's shared secret" in decode_log,
          f"the decode worker's log does not name the refusal:\n{decode_log[-3000:]}")
    check(refused["decode"] >= 1 and refused["prefill"] == 0,
          f"the decode worker refused (and counted) the connections: {refused}")
    print("ok: a decode worker with another secret receives no KV; the request is prefilled on it")
    decode_log, prefill_log, refused = mismatched(build_dir, d, stubs,
                                                  ["--allow-unauthenticated-kv"], reference,
                                                  "no-secret")
    check("no shared secret configured there" in prefill_log,
          f"the prefill worker's log does not name the cause:\n{prefill_log[-3000:]}")
    check("the KV data path is not authenticated" in decode_log,
          f"the decode worker without a secret did not warn:\n{decode_log[-3000:]}")
    check(refused["prefill"] >= 1 and refused["decode"] == 0,
          f"the prefill worker refused (and counted) the connections: {refused}")
    print("ok: a decode worker without a secret is refused by the prefill worker")

    # 3. Bad secret files stop the process at startup with a message.
    exe = os.path.join(build_dir, "bin", "tandem")
    for args, expect in ((["decode"], "no --kv-secret-file"),
                         (["prefill"], "--allow-unauthenticated-kv"),
                         (["worker", "--role", "both"], "no --kv-secret-file"),
                         (["decode", "--kv-secret-file", os.path.join(d, "short.secret")],
                          "at least 16"),
                         (["prefill", "--kv-secret-file", os.path.join(d, "missing")],
                          "cannot be read"),
                         (["serve", "--kv-secret-file", os.path.join(d, "a.secret")],
                          "needs cluster mode")):
        r = subprocess.run([exe, *args, "--port", "0"], capture_output=True, timeout=120)
        out = (r.stdout + r.stderr).decode("utf-8", "replace")
        check(r.returncode == 2 and expect in out, f"{args}: rc {r.returncode}: {out[-1000:]}")
    print("ok: workers without a KV secret (and without --allow-unauthenticated-kv), unreadable, "
          "short or misplaced secret files are refused at startup")
    print("PASS")


if __name__ == "__main__":
    main()
