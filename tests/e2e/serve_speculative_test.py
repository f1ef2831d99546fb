#!/usr/bin/python3
"""Speculative decoding through the gRPC API: 64 concurrent greedy requests give outputs
bit-identical to speculation off, with the n-gram proposer and with a draft model (llama2xs-280k
drafting for stories260k), in monolithic mode and in a disaggregated cluster (where the decode
worker prefills the draft model itself); the final message reports accepted tokens."""
import concurrent.futures
import os
import random
import sys

import grpc

from tandem_testlib import ROOT, Cluster, Server, check, generate, load_stubs, make_prompt


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    rng = random.Random(5)
    cases = []
    for i in range(64):
        prompt = make_prompt(rng, 4, 30)
        if i % 2 == 0:  # copy-heavy: the answer is likely to repeat the prompt
            prompt = prompt + ". " + prompt + ". " + prompt
        cases.append((prompt, rng.randint(8, 64)))

    def run_all(address):
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))

        def one(case):
            prompt, max_tokens = case
            out = generate(stubs, stub, text=prompt,
                           sampling=dict(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
            return out["ids"], out["final"].usage.spec_accepted_tokens

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            return list(pool.map(one, cases))

    with Server(build_dir) as plain:
        want = [ids for ids, _ in run_all(plain.address)]

    draft = os.path.join(ROOT, "models", "llama2xs-280k")
    configs = [
        ("monolithic, ngram", Server, [], ["--speculative-method", "ngram"]),
        ("monolithic, draft", Server, [], ["--speculative-method", "draft", "--draft-model", draft]),
        ("disaggregated, draft", Cluster, [1, 1],
         ["--speculative-method", "draft", "--draft-model", draft,
          "--disagg-min-uncached-tokens", "0", "--max-prefills-per-worker", "64"]),
        ("disaggregated, ngram", Cluster, [1, 1],
         ["--speculative-method", "ngram", "--disagg-min-uncached-tokens", "0"]),
    ]
    for name, kind, sizes, flags in configs:
        with kind(build_dir, *[str(s) for s in sizes], *flags) as server:
            got = run_all(server.address)
            for i, ((ids, _), w) in enumerate(zip(got, want)):
                check(ids == w, f"{name}: request {i} differs from decoding without speculation")
            accepted = sum(a for _, a in got)
            check(accepted > 0, f"{name}: the final messages report accepted speculative tokens")
            print(f"ok: {name}: 64 concurrent greedy outputs identical; {accepted} drafted tokens "
                  f"accepted")
    print("PASS")


if __name__ == "__main__":
    main()
