#!/usr/bin/python3
"""Prefix caching through `tandem serve`: a second request sharing a 256-token prefix reports
at least 240 cached tokens and the same output as a server with the cache disabled; cache salts
keep requests from sharing."""
import sys

import grpc

from tandem_testlib import Server, check, generate, load_stubs


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    common = [1] + [(7 * i) % 500 + 3 for i in range(255)]  # 256 tokens
    first = common + [40, 41, 42]
    second = common + [50, 51, 52, 53]
    params = dict(temperature=0, max_tokens=32, ignore_eos=True)

    def ids(x):
        return stubs.common.TokenIds(ids=x)

    with Server(build_dir, "--no-prefix-cache") as server:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))
        generate(stubs, stub, token_ids=ids(first), sampling=params)
        uncached = generate(stubs, stub, token_ids=ids(second), sampling=params)[0]
        check(uncached["final"].usage.cached_tokens == 0, "cache disabled: nothing cached")

    with Server(build_dir) as server:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))
        a = generate(stubs, stub, token_ids=ids(first), sampling=params)[0]
        check(a["final"].usage.cached_tokens == 0, f"cold cache: {a['final'].usage}")
        b = generate(stubs, stub, token_ids=ids(second), sampling=params)[0]
        cached = b["final"].usage.cached_tokens
        check(cached >= 240, f"second request reports {cached} cached tokens (want >= 240)")
        check(b["ids"] == uncached["ids"], "output with the prefix cache equals output without it")
        print(f"ok: {cached} of {len(second)} prompt tokens served from the prefix cache, same output")

        salted = generate(stubs, stub, token_ids=ids(second), cache_salt="tenant-b", sampling=params)[0]
        check(salted["final"].usage.cached_tokens == 0, "another salt shares nothing")
        again = generate(stubs, stub, token_ids=ids(second), cache_salt="tenant-b", sampling=params)[0]
        check(again["final"].usage.cached_tokens >= 240, "the same salt shares")
        check(salted["ids"] == uncached["ids"] == again["ids"], "salted outputs identical")
        print("ok: cache salt isolates prefixes")
    print("PASS")


if __name__ == "__main__":
    main()
