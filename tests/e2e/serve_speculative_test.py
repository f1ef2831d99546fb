#!/usr/bin/python3
"""Speculative decoding through the gRPC API: 64 concurrent greedy requests give outputs
bit-identical to speculation off, with the n-gram proposer (stories260k) and with a draft model
(llama2xs-280k drafting for stories260k, and the reverse), in monolithic mode and in a
disaggregated cluster (where the decode worker prefills the draft model itself); the final
message reports accepted tokens."""
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

    models = os.path.join(ROOT, "models")
    # (target, draft): the draft model drafts for the target, and the reverse.
    for target, draft in (("stories260k", "llama2xs-280k"), ("llama2xs-280k", "stories260k")):
        target_dir, draft_dir = os.path.join(models, target), os.path.join(models, draft)
        with Server(build_dir, model=target_dir) as plain:
            want = [ids for ids, _ in run_all(plain.address)]
        draft_flags = ["--speculative-method", "draft", "--draft-model", draft_dir]
        configs = [
            ("monolithic, draft", Server, [], draft_flags),
            ("disaggregated, draft", Cluster, [1, 1],
             draft_flags + ["--disagg-min-uncached-tokens", "0", "--max-prefills-per-worker",
                            "64"]),
        ]
        if target == "stories260k":
            configs += [
                ("monolithic, ngram", Server, [], ["--speculative-method", "ngram"]),
                ("disaggregated, ngram", Cluster, [1, 1],
                 ["--speculative-method", "ngram", "--disagg-min-uncached-tokens", "0"]),
            ]
        for name, kind, sizes, flags in configs:
            name = f"{target}, {name}" + (f" ({draft})" if "draft" in name else "")
            with kind(build_dir, *[str(s) for s in sizes], *flags, model=target_dir) as server:
                got = run_all(server.address)
                for i, ((ids, _), w) in enumerate(zip(got, want)):
                    check(ids == w, f"{name}: request {i} differs from decoding without "
                          "speculation")
                accepted = sum(a for _, a in got)
                check(accepted > 0, f"{name}: the final messages report accepted speculative "
                      "tokens")
                print(f"ok: {name}: 64 concurrent greedy outputs identical; {accepted} drafted "
                      "tokens accepted")
    print("PASS")


if __name__ == "__main__":
    main()
