#!/usr/bin/python3
"""Disaggregated serving (real processes on loopback): 64 concurrent greedy requests through
prefill -> KV transfer over TCP -> decode give outputs bit-identical to monolithic mode, and
afterwards every worker holds zero KV blocks, reservations and transfers. Every final carries
the TTFT split of its remote prefill (the prefill worker's timings, which the router takes from
the Prefill response even when the decode worker's final arrives first)."""
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
        out = generate(stubs, stub, text=prompt, sampling=dict(
            temperature=temperature, seed=5, max_tokens=max_tokens, ignore_eos=True))[0]
        return out["ids"], out["final"]

    with Server(build_dir) as mono:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(mono.address))
        want = [run(stub, c)[0] for c in cases]

    with Cluster(build_dir, 2, 2, "--disagg-min-uncached-tokens", "0",
                 "--max-prefills-per-worker", "64") as cluster:
        channel = grpc.insecure_channel(cluster.address)
        stub = stubs.gen_grpc.GenerationStub(channel)
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(lambda c: run(stub, c), cases))
        for i, (a, (b, final)) in enumerate(zip(want, got)):
            check(a == b, f"request {i}: disaggregated output differs from monolithic")
            t = final.timings
            check(t.remote and t.remote_prefill_s > 0 and t.kv_transfer_s > 0 and
                  t.time_to_first_token_s > 0,
                  f"request {i} (max_tokens {cases[i][1]}): final without the TTFT split: {t}")
        # One at a time, one output token: the decode worker's final leaves right after its KV
        # ACK, racing the Prefill response to the router (before the fix, 3 to 15 of these 32
        # finals lacked the prefill worker's timings).
        for i, (prompt, _, _) in enumerate(cases[:32]):
            final = generate(stubs, stub, text=prompt, sampling=dict(
                temperature=0, max_tokens=1, ignore_eos=True))[0]["final"]
            t = final.timings
            check(t.remote and t.remote_prefill_s > 0 and t.kv_transfer_s > 0,
                  f"sequential request {i}: final without the TTFT split: {t}")
        status = cluster_status(stubs, channel)
        check(status.remote_prefills >= 64 + 32, f"every request was prefilled remotely: {status}")
        check(status.failures == 0 and status.migrations == 0, str(status))
        channels = [c for lst in cluster.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels)
        print(f"ok: 64 concurrent requests (greedy and seeded) identical to monolithic; "
              f"{status.remote_prefills} remote prefills (32 more one at a time), each final with "
              f"its TTFT split; no KV blocks, reservations or transfers left on {len(channels)} "
              f"workers")
        code = cluster.terminate()
        check(code == 0, f"serve exit code {code}")
    print("PASS")


if __name__ == "__main__":
    main()
