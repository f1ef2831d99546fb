#!/usr/bin/python3
"""Routing over 2 prefill and 2 decode workers (real processes), what the routing policies promise:
- 8 shared 512-token system prompts x 64 requests: prefix_affinity reaches a prefix-cache hit
  rate of at least 85% of the achievable tokens, round_robin does not;
- one dominant prefix: the busiest decode worker carries at most 1.5x the requests of the
  least busy (the imbalance bound).
The 8-prefix workload runs under cache pressure, as a real one does: each worker's KV pool
(--num-kv-blocks) holds about 5 of the 8 prefixes besides the blocks of the requests in flight.
Round robin sends every prefix to both decode workers, so each sees all 8 and its LRU prefix
cache thrashes; prefix_affinity partitions the prefixes (4 per worker), which fit. Requests go
out in a fixed shuffled order with a bounded number in flight, so the pressure on the pools does
not depend on the machine's speed. The hit rate is the decode workers' cached prompt tokens
(each final's usage.cached_tokens) over the achievable ones (every request but the first of its
prefix could reuse its 512 prefix tokens).
Uses the random `tiny` model (context 2048) written by `tandem make-model`."""
import concurrent.futures
import os
import random
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))

import grpc  # noqa: E402

from tandem_testlib import Cluster, check, cluster_status, generate, load_stubs  # noqa: E402

PREFIX_TOKENS = 512
BLOCK_SIZE = 16
# Per worker: 5.5 prefixes of 32 blocks. A request holds its prefix's 32 blocks (shared with the
# other requests of that prefix) plus 2 of its own (16-token question, 4 output tokens).
NUM_KV_BLOCKS = 176
# Requests in flight at once. The router's prefix_affinity cost prefers a cached prefix over
# a load difference of up to 32 blocks / w_load 0.25 = 128 blocks (about 3 requests), and its
# imbalance bound allows 128 blocks of slack: with 2 in flight neither moves a prefix to the
# other worker, whatever the timing.
CONCURRENCY = 2


def run_workload(stubs, cluster, prefixes, questions, order, concurrency, max_tokens=4,
                 at_once=False):
    """Sends order's (question index, prefix index) requests in order, `concurrency` at a time
    (at_once: all together, released by a barrier); returns [(prefix index, cached prompt
    tokens)] in the same order."""
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(cluster.address))
    barrier = threading.Barrier(len(order)) if at_once else None

    def one(item):
        i, k = item
        if barrier is not None:
            barrier.wait(timeout=60)
        out = generate(stubs, stub, token_ids=stubs.common.TokenIds(ids=prefixes[k] + questions[i]),
                       sampling=dict(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        return k, out[0]["final"].usage.cached_tokens

    with concurrent.futures.ThreadPoolExecutor(len(order) if at_once else concurrency) as pool:
        return list(pool.map(one, order))


def hit_rate(results):
    seen, hits, achievable = set(), 0, 0
    for k, cached in results:
        if k in seen:  # the first request of a prefix cannot hit
            achievable += PREFIX_TOKENS
            hits += min(cached, PREFIX_TOKENS)
        seen.add(k)
    return hits / achievable


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    rng = random.Random(2)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny")
        subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", "tiny",
                        "--dtype", "f32", "--out", model], check=True, capture_output=True)
        prefixes = [[1] + [rng.randint(3, 31999) for _ in range(PREFIX_TOKENS - 1)]
                    for _ in range(8)]
        questions = [[rng.randint(3, 31999) for _ in range(16)] for _ in range(64)]
        # 64 requests, 8 per prefix: one of each prefix first, then the other 56 shuffled.
        followers = [(i, i % 8) for i in range(8, 64)]
        rng.shuffle(followers)
        order = [(i, i) for i in range(8)] + followers
        common = ["--model", model, "--max-model-len", "1024", "--max-prefills-per-worker", "64"]
        pressure = ["--num-kv-blocks", str(NUM_KV_BLOCKS), "--block-size", str(BLOCK_SIZE)]
        rates = {}
        for policy in ("prefix_affinity", "round_robin"):
            with Cluster(build_dir, 2, 2, *common, *pressure, "--routing-policy", policy) \
                    as cluster:
                results = run_workload(stubs, cluster, prefixes, questions, order, CONCURRENCY)
                rates[policy] = hit_rate(results)
                status = cluster_status(stubs, grpc.insecure_channel(cluster.address))
                check(status.failures == 0, str(status))
                loads = sorted(w.routed_requests for w in status.workers if w.role == "decode")
            print(f"ok: {policy}: prefix-cache hit rate {rates[policy]:.1%} of achievable tokens "
                  f"(decode workers took {loads} requests)")
        check(rates["prefix_affinity"] >= 0.85, f"prefix_affinity hit rate {rates}")
        check(rates["round_robin"] < 0.85, f"round_robin reaches 85% too: {rates}")

        # One dominant prefix (default KV pools).
        with Cluster(build_dir, 2, 2, *common, "--routing-policy", "prefix_affinity") as cluster:
            # All 64 share prefix 0: the first alone, then the other 63 at once, long enough
            # (32 output tokens) to be in flight together however slow their start.
            run_workload(stubs, cluster, prefixes, questions, [(0, 0)], 1)
            run_workload(stubs, cluster, prefixes, questions, [(i, 0) for i in range(1, 64)], 63,
                         max_tokens=32, at_once=True)
            status = cluster_status(stubs, grpc.insecure_channel(cluster.address))
            loads = sorted(w.routed_requests for w in status.workers if w.role == "decode")
            check(len(loads) == 2 and loads[0] > 0, f"decode loads {loads}")
            check(loads[-1] <= 1.5 * loads[0], f"busiest {loads[-1]} > 1.5 x least {loads[0]}")
            print(f"ok: one dominant prefix: decode workers carry {loads} requests "
                  f"(ratio {loads[-1] / loads[0]:.2f} <= 1.5)")
    print("PASS")


if __name__ == "__main__":
    main()
