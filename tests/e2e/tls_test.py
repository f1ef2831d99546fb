#!/usr/bin/python3
"""TLS and mTLS on every listener, with certificates made here with `openssl`: `tandem serve`
(gRPC, HTTP and Prometheus /metrics) refuses plaintext clients, clients without a certificate
and clients with a certificate of another CA, and serves clients with a valid one; in a
disaggregated cluster (`tandem serve --prefill-workers 1 --decode-workers 1`) the workers' gRPC
and /metrics listeners refuse clients without a certificate while the router (presenting its
certificate) serves through them; a decode worker whose certificate another CA signed cannot
join a `tandem router`."""
import os
import subprocess
import sys
import tempfile
import time

import grpc

from http_api_test import HttpServer
from tandem_testlib import (INTERNAL_TOKEN_KEY, Cluster, check, cluster_secret, generate,  # noqa: E402
                            internal_token, kv_secret, load_stubs)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], check=True, cwd=cwd, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def make_cert(d, name, ca):
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


def read(d, name):
    return open(os.path.join(d, name), "rb").read()


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    d = tempfile.mkdtemp(prefix="tandem-tls-")
    make_ca(d, "ca")
    make_ca(d, "rogue_ca")
    make_cert(d, "node", "ca")
    make_cert(d, "rogue", "rogue_ca")
    p = lambda name: os.path.join(d, name)  # noqa: E731
    tls = ["--tls-cert", p("node.pem"), "--tls-key", p("node.key"), "--tls-ca", p("ca.pem"),
           "--tls-client-auth"]

    def creds(cert="node", root="ca"):
        if cert is None:
            return grpc.ssl_channel_credentials(root_certificates=read(d, f"{root}.pem"))
        return grpc.ssl_channel_credentials(root_certificates=read(d, f"{root}.pem"),
                                            private_key=read(d, f"{cert}.key"),
                                            certificate_chain=read(d, f"{cert}.pem"))

    def grpc_ok(address, credentials):
        channel = (grpc.secure_channel(address, credentials) if credentials is not None
                   else grpc.insecure_channel(address))
        stub = stubs.gen_grpc.GenerationStub(channel)
        try:
            stub.ListModels(stubs.gen.ListModelsRequest(), timeout=5)
            return True
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE, f"refused as UNAVAILABLE: {e.code()}")
            return False

    def curl(port, *args):
        r = subprocess.run(["curl", "-sS", "--max-time", "10", *args,
                            f"https://127.0.0.1:{port}/v1/models"], capture_output=True)
        return r.returncode == 0 and b'"object":"list"' in r.stdout

    good = ["--cacert", p("ca.pem"), "--cert", p("node.pem"), "--key", p("node.key")]

    def check_metrics_listener(port, what):
        """/metrics on `port`: Prometheus text over mTLS only."""
        def get(scheme, *args):
            r = subprocess.run(["curl", "-sS", "--max-time", "10", *args,
                                f"{scheme}://127.0.0.1:{port}/metrics"], capture_output=True)
            return r.returncode == 0 and b"# TYPE tandem_build_info gauge" in r.stdout
        check(get("https", *good), f"{what}: /metrics over mTLS serves Prometheus text")
        check(not get("http"), f"{what}: plaintext /metrics refused")
        check(not get("https", "--cacert", p("ca.pem")), f"{what}: /metrics without a client cert")
        check(not get("https", "--cacert", p("ca.pem"), "--cert", p("rogue.pem"), "--key",
                      p("rogue.key")), f"{what}: /metrics with a rogue client cert refused")
        check(get("https", *good), f"{what}: /metrics still serves after the refusals")

    metrics_file = p("serve.metrics")
    metrics = ["--metrics-port=-1", f"--metrics-port-file={metrics_file}"]
    with HttpServer(build_dir, *tls, *metrics) as server:
        check(grpc_ok(server.address, creds()), "gRPC with a valid client certificate")
        stub = stubs.gen_grpc.GenerationStub(grpc.secure_channel(server.address, creds()))
        out = generate(stubs, stub, text="Once upon a time", sampling=dict(temperature=0, max_tokens=8))
        check(out[0]["final"].usage.completion_tokens == 8, "generation over mTLS")
        check(not grpc_ok(server.address, None), "plaintext gRPC refused")
        check(not grpc_ok(server.address, creds(cert=None)), "gRPC without a client cert refused")
        check(not grpc_ok(server.address, creds(cert="rogue")), "gRPC with a rogue cert refused")
        port = server.http_port
        check(curl(port, *good), "HTTPS with a valid client certificate")
        check(not curl(port, "--cacert", p("ca.pem")), "HTTPS without a client cert refused")
        check(not curl(port, "--cacert", p("ca.pem"), "--cert", p("rogue.pem"), "--key",
                       p("rogue.key")), "HTTPS with a rogue client cert refused")
        r = subprocess.run(["curl", "-sS", "--max-time", "10", f"http://127.0.0.1:{port}/v1/models"],
                           capture_output=True)
        check(b'"object":"list"' not in r.stdout, "plaintext HTTP refused")
        check_metrics_listener(int(open(metrics_file).read()), "serve")
        print("ok: serve: gRPC, HTTPS and /metrics listeners accept only clients with a valid "
              "certificate")

    os.unlink(metrics_file)
    with Cluster(build_dir, 1, 1, *tls, *metrics) as cluster:
        stub = stubs.gen_grpc.GenerationStub(grpc.secure_channel(cluster.address, creds()))
        out = generate(stubs, stub, text="Once upon a time", sampling=dict(temperature=0, max_tokens=8))
        check(out[0]["final"].usage.completion_tokens == 8, "cluster generation over mTLS")
        for role, workers in cluster.children().items():
            for _, port in workers:
                address = f"127.0.0.1:{port}"
                ch = grpc.secure_channel(address, creds(cert=None))
                try:
                    stubs.worker_grpc.WorkerStub(ch).GetInfo(stubs.worker.InfoRequest(), timeout=5)
                    check(False, f"{role} worker served a client without a certificate")
                except grpc.RpcError as e:
                    check(e.code() == grpc.StatusCode.UNAVAILABLE, f"{role}: {e.code()}")
                for bad in (grpc.insecure_channel(address),
                            grpc.secure_channel(address, creds(cert="rogue"))):
                    try:
                        stubs.worker_grpc.WorkerStub(bad).GetInfo(stubs.worker.InfoRequest(),
                                                                  timeout=5)
                        check(False, f"{role} worker served a plaintext / rogue client")
                    except grpc.RpcError:
                        pass
                info = stubs.worker_grpc.WorkerStub(grpc.secure_channel(address, creds())).GetInfo(
                    stubs.worker.InfoRequest(), timeout=5, metadata=[(INTERNAL_TOKEN_KEY, internal_token(
                        cluster_secret()[1], "/tandem.v1.Worker/GetInfo"))])
                check(info.role == role, f"{role} worker serves the router's certificate")
        check_metrics_listener(int(open(metrics_file).read()), "cluster router")
        targets = open(metrics_file + ".workers").read().split()
        check(len(targets) == 4, f"two workers' /metrics targets: {targets}")
        for role, target in zip(targets[::2], targets[1::2]):
            check_metrics_listener(int(target.rsplit(":", 1)[1]), f"{role} worker")
        print("ok: cluster: workers' listeners (gRPC, /metrics) require a valid client "
              "certificate; the router's works")

    # A decode worker with another CA's certificate cannot join a router.
    procs = []
    try:
        ports = {}
        for name, cert, ca in (("good", "node", "ca"), ("rogue", "rogue", "rogue_ca")):
            port_file = p(f"{name}.port")
            procs.append(subprocess.Popen(
                [os.path.join(build_dir, "bin", "tandem"), "decode", "--port", "0", "--port-file",
                 port_file, "--tls-cert", p(f"{cert}.pem"), "--tls-key", p(f"{cert}.key"),
                 "--tls-ca", p(f"{ca}.pem"), "--tls-client-auth", "--kv-secret-file",
                 kv_secret()[0]],
                stdout=open(p(f"{name}.log"), "wb"), stderr=subprocess.STDOUT))
            deadline = time.time() + 60
            while not os.path.exists(port_file):
                check(time.time() < deadline and procs[-1].poll() is None,
                      f"{name} worker did not start: {read(d, name + '.log')[-2000:]!r}")
                time.sleep(0.05)
            ports[name] = int(open(port_file).read())
        router = [os.path.join(build_dir, "bin", "tandem"), "router", "--port", "0",
                  "--startup-timeout", "5", "--tls-cert", p("node.pem"), "--tls-key", p("node.key"),
                  "--tls-ca", p("ca.pem")]
        rogue = subprocess.run(router + ["--decode-addresses", f"127.0.0.1:{ports['rogue']}"],
                               capture_output=True, timeout=60)
        check(rogue.returncode != 0 and b"no decode worker registered" in rogue.stderr + rogue.stdout,
              f"router with only the rogue worker: {rogue.returncode} {rogue.stderr[-500:]!r}")
        port_file = p("router.port")
        good = subprocess.Popen(router + ["--decode-addresses", f"127.0.0.1:{ports['good']}",
                                          "--port-file", port_file],
                                stdout=open(p("router.log"), "wb"), stderr=subprocess.STDOUT)
        procs.append(good)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            check(time.time() < deadline and good.poll() is None,
                  f"router did not start: {read(d, 'router.log')[-2000:]!r}")
            time.sleep(0.05)
        print("ok: a worker with a certificate of another CA cannot join; a valid one can")
        # --tls-server-name: the router verifies workers against that name instead of the
        # address it dials (pod IPs in Kubernetes); their certificate must carry it.
        wrong = subprocess.run(router + ["--decode-addresses", f"127.0.0.1:{ports['good']}",
                                         "--tls-server-name", "not-in-the-cert"],
                               capture_output=True, timeout=60)
        check(wrong.returncode != 0 and b"no decode worker registered" in wrong.stderr + wrong.stdout,
              f"router verifying a name the certificate lacks: {wrong.returncode}")
        port_file = p("named.port")
        named = subprocess.Popen(router + ["--decode-addresses", f"127.0.0.1:{ports['good']}",
                                           "--tls-server-name", "localhost", "--port-file",
                                           port_file],
                                 stdout=open(p("named.log"), "wb"), stderr=subprocess.STDOUT)
        procs.append(named)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            check(time.time() < deadline and named.poll() is None,
                  f"router with --tls-server-name did not start: {read(d, 'named.log')[-2000:]!r}")
            time.sleep(0.05)
        print("ok: --tls-server-name: a worker registers only when its certificate carries it")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print("PASS")


if __name__ == "__main__":
    main()
