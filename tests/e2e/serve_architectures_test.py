#!/usr/bin/python3
"""Every architecture beyond Llama through the gRPC API: on a random model of each family's tiny
preset (`tandem make-model`, with its own tokenizer), 32 concurrent greedy requests give outputs
bit-identical to a monolithic server without speculation when served disaggregated (one prefill
worker, two decode workers, KV over TCP), with n-gram speculation, and with both; afterwards no
worker holds KV.

Usage: serve_architectures_test.py BUILD_DIR [PRESET ...]"""
import concurrent.futures
import os
import random
import subprocess
import sys
import tempfile

import grpc

from tandem_testlib import (Cluster, Server, check, generate, load_stubs, make_prompt,
                            wait_no_leaks)

PRESETS = ["qwen3-tiny", "phi3-tiny", "phi4-tiny", "gemma3-tiny", "gemma2-tiny",
           "mixtral-tiny", "qwen3-moe-tiny"]


def run_preset(build_dir, stubs, preset, work):
    model = os.path.join(work, preset)
    subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", preset,
                    "--seed", "11", "--init-std", "0.08", "--norm-std", "0.2", "--out", model],
                   check=True, capture_output=True, timeout=300)
    rng = random.Random(preset)
    cases = []
    for i in range(32):
        prompt = make_prompt(rng, 4, 30)
        if i % 2 == 0:  # repeats, so that n-gram lookup proposes drafts
            prompt = prompt + ". " + prompt
        cases.append((prompt, rng.randint(4, 40)))

    def run_all(address):
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))

        def one(case):
            prompt, max_tokens = case
            out = generate(stubs, stub, text=prompt,
                           sampling=dict(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
            return out["ids"], out["final"]

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            return list(pool.map(one, cases))

    with Server(build_dir, model=model) as plain:
        want = [ids for ids, _ in run_all(plain.address)]
    check(len({t for ids in want for t in ids}) > 8, f"{preset}: the outputs vary")
    disagg = ["--disagg-min-uncached-tokens", "0", "--max-prefills-per-worker", "32"]
    ngram = ["--speculative-method", "ngram"]
    for name, kind, sizes, flags in (
            ("1P+2D disaggregated", Cluster, [1, 2], disagg),
            ("monolithic, ngram", Server, [], ngram),
            ("1P+2D disaggregated, ngram", Cluster, [1, 2], disagg + ngram)):
        with kind(build_dir, *[str(s) for s in sizes], *flags, model=model) as server:
            got = run_all(server.address)
            for i, ((ids, final), w) in enumerate(zip(got, want)):
                check(ids == w, f"{preset}, {name}: request {i} differs from monolithic")
                if kind is Cluster:
                    check(final.timings.remote, f"{preset}, {name}: request {i} not disaggregated")
            if kind is Cluster:
                channels = [ch for lst in server.worker_channels().values() for ch in lst]
                check(len(channels) == 3, f"{preset}: {len(channels)} workers")
                wait_no_leaks(stubs, channels)
            if "ngram" in name:
                accepted = sum(f.usage.spec_accepted_tokens for _, f in got)
                check(accepted > 0, f"{preset}, {name}: no drafted token accepted")
            print(f"ok: {preset}, {name}: 32 concurrent greedy outputs identical")


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    with tempfile.TemporaryDirectory(prefix="tandem_arch_") as work:
        for preset in sys.argv[2:] or PRESETS:
            run_preset(build_dir, stubs, preset, work)
    print("PASS")


if __name__ == "__main__":
    main()
