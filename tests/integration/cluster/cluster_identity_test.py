#!/usr/bin/python3
"""Disaggregated serving (real processes on loopback): 64 concurrent greedy requests through
prefill -> KV transfer over TCP -> decode give outputs bit-identical to monolithic mode, and
afterwards every worker holds zero KV blocks, reservations and transfers."""
import concurrent.futures
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))

import grpc  # noqa: E402

from tandem_testlib import (Cluster, Server, check, cluster_status, generate, load_stubs,  # noqa: E402
                            make_prompt, wait_no_leaks)


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    rng = random.Random(11)
    cases = [(make_prompt(rng, 5, 80), rng.randint(1, 60), rng.choice([0.0, 0.0, 1.0]))
             for _ in range(64)]

    def run(stub, case):
        prompt, max_tokens, temperature = case
        return generate(stubs, stub, text=prompt, sampling=dict(
            temperature=temperature, seed=5, max_tokens=max_tokens, ignore_eos=True))[0]["ids"]

    with Server(build_dir) as mono:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(mono.address))
        want = [run(stub, c) for c in cases]

    with Cluster(build_dir, 2, 2, "--disagg-min-uncached-tokens", "0",
                 "--max-prefills-per-worker", "64") as cluster:
        channel = grpc.insecure_channel(cluster.address)
        stub = stubs.gen_grpc.GenerationStub(channel)
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(lambda c: run(stub, c), cases))
        for i, (a, b) in enumerate(zip(want, got)):
            check(a == b, f"request {i}: disaggregated output differs from monolithic")
        status = cluster_status(stubs, channel)
        check(status.remote_prefills >= 64, f"every request was prefilled remotely: {status}")
        check(status.failures == 0 and status.migrations == 0, str(status))
        channels = [c for lst in cluster.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels)
        print(f"ok: 64 concurrent requests (greedy and seeded) identical to monolithic; "
              f"{status.remote_prefills} remote prefills; no KV blocks, reservations or "
              f"transfers left on {len(channels)} workers")
        code = cluster.terminate()
        check(code == 0, f"serve exit code {code}")
    print("PASS")


if __name__ == "__main__":
    main()
