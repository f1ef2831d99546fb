#!/usr/bin/python3
"""Failures in a disaggregated cluster (real processes, kill -9):
- a decode worker dies with 16 streams in flight: every stream completes, token for token equal
  to an undisturbed run (the router migrates each sample with the tokens it already streamed);
- a prefill worker dies with prefills in flight: they are retried on the other prefill worker
  while the decode workers keep their reservations;
and afterwards no worker holds KV blocks, reservations or transfers."""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))

import grpc  # noqa: E402

from tandem_testlib import (Cluster, Server, check, cluster_status, load_stubs,  # noqa: E402
                            wait_no_leaks)

PROMPTS = [f"Once upon a time there was a {w} named {n}" for w, n in
           [("girl", "Lily"), ("boy", "Tom"), ("dog", "Max"), ("cat", "Sue")]] * 4
PARAMS = dict(temperature=0, max_tokens=250, ignore_eos=True)


def stream_all(stubs, stub, progress):
    """Starts the 16 streams; returns (threads, results)."""
    results = [None] * len(PROMPTS)

    def run(i):
        ids, final = [], None
        try:
            for r in stub.Generate(stubs.gen.GenerateRequest(
                    text=PROMPTS[i], sampling=stubs.sampling.SamplingParams(**PARAMS)), timeout=300):
                if r.HasField("chunk"):
                    ids.extend(r.chunk.token_ids)
                    progress[i] = len(ids)
                else:
                    final = r.final
            results[i] = (ids, final)
        except grpc.RpcError as e:
            results[i] = (ids, e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    return threads, results


def check_results(stubs, results, want, what):
    for i, (ids, final) in enumerate(results):
        check(not isinstance(final, grpc.RpcError), f"{what}: stream {i} failed: {final}")
        check(ids == want[PROMPTS[i]], f"{what}: stream {i} differs from the undisturbed run "
              f"({len(ids)} tokens vs {len(want[PROMPTS[i]])})")
        check(final.usage.completion_tokens == PARAMS["max_tokens"], f"{what}: usage {final.usage}")


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    with Server(build_dir) as mono:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(mono.address))
        want = {}
        for p in set(PROMPTS):
            out = [r for r in stub.Generate(stubs.gen.GenerateRequest(
                text=p, sampling=stubs.sampling.SamplingParams(**PARAMS)))]
            want[p] = [t for r in out if r.HasField("chunk") for t in r.chunk.token_ids]

    # Decode worker death.
    with Cluster(build_dir, 1, 2, "--disagg-min-uncached-tokens", "0") as cluster:
        channel = grpc.insecure_channel(cluster.address)
        stub = stubs.gen_grpc.GenerationStub(channel)
        progress = [0] * len(PROMPTS)
        threads, results = stream_all(stubs, stub, progress)
        deadline = time.time() + 60
        while min(progress) < 5 and time.time() < deadline:
            time.sleep(0.005)
        # On a loaded machine a stream may finish before the slowest prefill lands; the kill
        # needs most of them mid-stream (the router must migrate those on the victim).
        in_flight = sum(p < PARAMS["max_tokens"] for p in progress)
        check(min(progress) >= 5 and in_flight >= len(PROMPTS) // 2,
              f"streams in flight: {progress}")
        victim_pid, victim_port = cluster.children()["decode"][0]
        os.kill(victim_pid, signal.SIGKILL)
        at_kill = sorted(progress)
        for t in threads:
            t.join(300)
        check_results(stubs, results, want, "decode worker killed")
        status = cluster_status(stubs, channel)
        check(status.migrations > 0, f"the router migrated streams: {status}")
        check(status.failures == 0, str(status))
        print(f"ok: decode worker (port {victim_port}) killed with {in_flight} streams in flight at "
              f"{at_kill[0]}..{at_kill[-1]} tokens: all 16 complete and identical; "
              f"{status.migrations} migrations")
        # The supervisor restarts the worker; once back, nothing is held anywhere.
        time.sleep(1)
        channels = [c for lst in cluster.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels, timeout=30)
        print("ok: no KV blocks, reservations or transfers left")

    # Prefill worker death: KV messages are slowed down (fault injection) so that transfers are
    # in flight when the worker dies.
    env = {"TANDEM_FAULTS": "kv_delay_ms=40"}
    with Cluster(build_dir, 2, 1, "--disagg-min-uncached-tokens", "0",
                 "--max-prefills-per-worker", "64", env=env) as cluster:
        channel = grpc.insecure_channel(cluster.address)
        stub = stubs.gen_grpc.GenerationStub(channel)
        progress = [0] * len(PROMPTS)
        threads, results = stream_all(stubs, stub, progress)
        time.sleep(0.15)
        victim_pid, victim_port = cluster.children()["prefill"][0]
        os.kill(victim_pid, signal.SIGKILL)
        for t in threads:
            t.join(300)
        check_results(stubs, results, want, "prefill worker killed")
        status = cluster_status(stubs, channel)
        check(status.prefill_retries > 0, f"prefills were retried: {status}")
        check(status.failures == 0, str(status))
        print(f"ok: prefill worker (port {victim_port}) killed with prefills in flight: "
              f"{status.prefill_retries} retried elsewhere, all 16 streams identical")
        time.sleep(1)
        channels = [c for lst in cluster.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels, timeout=30)
        print("ok: no KV blocks, reservations or transfers left")
    print("PASS")


if __name__ == "__main__":
    main()
