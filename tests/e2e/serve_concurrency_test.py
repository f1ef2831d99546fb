#!/usr/bin/python3
"""64 concurrent greedy streams through `tandem serve` (real gRPC client, Debian's python3-grpcio)
give token-for-token the same output as each prompt run alone; plus n > 1, seeds, stop strings
and logprobs through the same API."""
import concurrent.futures
import math
import random
import sys

import grpc

from tandem_testlib import Server, check, generate, load_stubs, make_prompt, serve_stats


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    rng = random.Random(7)
    cases = [(make_prompt(rng, 1, 60), rng.randint(1, 80)) for _ in range(64)]
    with Server(build_dir, "--max-num-seqs", "64") as server:
        channel = grpc.insecure_channel(server.address)
        stub = stubs.gen_grpc.GenerationStub(channel)

        def run(case):
            prompt, max_tokens = case
            out = generate(stubs, stub, text=prompt,
                           sampling=dict(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            return out[0]

        solo = [run(c) for c in cases]
        for (prompt, max_tokens), s in zip(cases, solo):
            check(len(s["ids"]) == max_tokens, f"solo run of {prompt!r} gave {len(s['ids'])} tokens")
            check(s["final"].usage.completion_tokens == max_tokens, "usage counts the tokens")
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            together = list(pool.map(run, cases))
        for i, (a, b) in enumerate(zip(solo, together)):
            check(a["ids"] == b["ids"], f"request {i}: concurrent output differs from solo")
            check(a["text"] == b["text"], f"request {i}: concurrent text differs from solo")
        print(f"ok: 64 concurrent greedy streams identical to solo runs")

        # The text streamed equals decoding the ids (checked against the reference model output).
        ref = generate(stubs, stub, text="Once upon a time", sampling=dict(temperature=0, max_tokens=64))
        check(ref[0]["text"].startswith(", there was a little girl named Lily."), repr(ref[0]["text"]))

        # n samples with a seed: reproducible, and differ from each other.
        a = generate(stubs, stub, text="Once upon a time", n=4,
                     sampling=dict(temperature=1.0, max_tokens=24, seed=11, ignore_eos=True))
        b = generate(stubs, stub, text="Once upon a time", n=4,
                     sampling=dict(temperature=1.0, max_tokens=24, seed=11, ignore_eos=True))
        check(sorted(a) == [0, 1, 2, 3], f"n=4 gives four samples: {sorted(a)}")
        check(all(a[i]["ids"] == b[i]["ids"] for i in range(4)), "same seed, same samples")
        check(len({tuple(a[i]["ids"]) for i in range(4)}) > 1, "samples differ from each other")
        print("ok: n=4 with a seed is reproducible")

        # Stop strings end the stream before the stop text.
        out = generate(stubs, stub, text="Once upon a time",
                       sampling=dict(temperature=0, max_tokens=64, stop=["Lily"]))[0]
        check(out["text"] == ", there was a little girl named ", repr(out["text"]))
        check(out["final"].finish_reason == stubs.common.FINISH_REASON_STOP, str(out["final"]))
        check(out["final"].stop_string == "Lily", str(out["final"]))
        print("ok: stop string")

        # Logprobs: the greedy token is the top-1 alternative, and logprobs are normalised.
        out = generate(stubs, stub, text="Once upon a time",
                       sampling=dict(temperature=0, max_tokens=4, logprobs=3))[0]
        channel2 = grpc.insecure_channel(server.address)
        for lp in [r for r in stubs.gen_grpc.GenerationStub(channel2).Generate(
                stubs.gen.GenerateRequest(text="Once upon a time",
                                          sampling=stubs.sampling.SamplingParams(
                                              temperature=0, max_tokens=4, logprobs=3)))
                   if r.HasField("chunk")][0].chunk.logprobs:
            check(lp.top[0].token_id == lp.chosen.token_id, "greedy token is the top-1")
            check(lp.chosen.logprob <= 0 and math.exp(lp.top[0].logprob) <= 1, "logprobs")
        print("ok: logprobs")
        stats = serve_stats(stubs, channel)
        check(stats.running == 0 and stats.waiting == 0, str(stats))
        check(stats.kv_blocks_used == 0, f"no block held after all requests: {stats}")
    print("PASS")


if __name__ == "__main__":
    main()
