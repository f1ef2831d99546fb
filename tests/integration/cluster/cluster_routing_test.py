#!/usr/bin/python3
"""Routing over 2 prefill and 2 decode workers (real processes):
- 8 shared 512-token system prompts x 64 requests: prefix_affinity reaches a prefix-cache hit
  rate of at least 85% of the achievable tokens and at least 5 points above round_robin's;
- one dominant prefix: the busiest decode worker carries at most 1.5x the requests of the
  least busy (the imbalance bound).
Uses the random `tiny` model (context 2048) written by `tandem make-model`."""
import concurrent.futures
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))

import grpc  # noqa: E402

from tandem_testlib import Cluster, check, cluster_status, generate, load_stubs  # noqa: E402

PREFIX_TOKENS = 512


def run_workload(stubs, cluster, prefixes, questions, waves):
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(cluster.address))

    def one(item):
        k, q = item
        out = generate(stubs, stub, token_ids=stubs.common.TokenIds(ids=prefixes[k] + q),
                       sampling=dict(temperature=0, max_tokens=4, ignore_eos=True))
        return k, out[0]["final"].usage.cached_tokens

    results = []
    for wave in waves:
        with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
            results += list(pool.map(one, [(k, questions[i]) for i, k in wave]))
    return results


def hit_rate(results, num_prefixes):
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
        # 64 requests, 8 per prefix: one of each prefix first, then the rest all at once.
        order = [(i, i % 8) for i in range(64)]
        waves = [order[:8], order[8:]]
        common = ["--model", model, "--max-model-len", "1024", "--max-prefills-per-worker", "64"]
        rates = {}
        for policy in ("prefix_affinity", "round_robin"):
            with Cluster(build_dir, 2, 2, *common, "--routing-policy", policy) as cluster:
                results = run_workload(stubs, cluster, prefixes, questions, waves)
                rates[policy] = hit_rate(results, 8)
                status = cluster_status(stubs, grpc.insecure_channel(cluster.address))
                check(status.failures == 0, str(status))
            print(f"ok: {policy}: prefix-cache hit rate {rates[policy]:.1%} of achievable tokens")
        check(rates["prefix_affinity"] >= 0.85, f"prefix_affinity hit rate {rates}")
        # Round robin spreads each prefix over both decode workers; after one miss per worker it
        # hits too, so with 2 workers and 7 followers per prefix it can come near 6/7 = 86%:
        # prefix_affinity must beat it clearly rather than round robin stay under 85%.
        check(rates["prefix_affinity"] >= rates["round_robin"] + 0.05,
              f"prefix_affinity does not beat round_robin: {rates}")

        # One dominant prefix: all 64 requests share prefix 0.
        with Cluster(build_dir, 2, 2, *common, "--routing-policy", "prefix_affinity") as cluster:
            run_workload(stubs, cluster, prefixes, questions,
                         [[(0, 0)], [(i, 0) for i in range(1, 64)]])
            status = cluster_status(stubs, grpc.insecure_channel(cluster.address))
            loads = sorted(w.routed_requests for w in status.workers if w.role == "decode")
            check(len(loads) == 2 and loads[0] > 0, f"decode loads {loads}")
            check(loads[-1] <= 1.5 * loads[0], f"busiest {loads[-1]} > 1.5 x least {loads[0]}")
            print(f"ok: one dominant prefix: decode workers carry {loads} requests "
                  f"(ratio {loads[-1] / loads[0]:.2f} <= 1.5)")
    print("PASS")


if __name__ == "__main__":
    main()
