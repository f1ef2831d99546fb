#!/usr/bin/python3
"""SIGTERM drains `tandem serve`: in-flight streams finish with all their tokens, new requests are
refused with UNAVAILABLE, then the process exits 0."""
import sys
import threading
import time

import grpc

from tandem_testlib import Server, check, generate, load_stubs


class SlowServer(Server):
    # Every engine step with work first sleeps 10 ms (common/engine/engine_faults.h), so the
    # 300-token streams are still running well after SIGTERM however fast the machine is.
    _env = {"TANDEM_FAULTS": "engine_stall_ms=10"}


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    with SlowServer(build_dir) as server:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))
        results = {}
        # Each stream is in flight (has a token) before SIGTERM: a request that has not reached
        # the server yet is rightly refused by the drain.
        started = [threading.Event() for _ in range(4)]

        def run(i):
            call = stub.Generate(stubs.gen.GenerateRequest(
                text="Once upon a time", sampling=stubs.sampling.SamplingParams(
                    temperature=0, max_tokens=300, ignore_eos=True)), timeout=120)
            n = 0
            for r in call:
                if r.HasField("chunk"):
                    n += len(r.chunk.token_ids)
                    started[i].set()
                else:
                    results[i] = (n, r.final.finish_reason)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        check(all(e.wait(30) for e in started), "streams started")
        server.proc.send_signal(15)
        time.sleep(0.2)
        try:
            generate(stubs, stub, text="Hi")
            raise AssertionError("a new request was served during the drain")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE, f"new request during drain: {e.code()}")
        for t in threads:
            t.join(120)
        check(sorted(results) == [0, 1, 2, 3], f"every in-flight stream finished: {results}")
        check(all(n == 300 and reason == stubs.common.FINISH_REASON_LENGTH
                  for n, reason in results.values()), f"complete outputs: {results}")
        code = server.proc.wait(60)
        check(code == 0, f"exit code {code}\n{server.logs()}")
        print("ok: 4 in-flight streams completed, new request UNAVAILABLE, exit 0")
    print("PASS")


if __name__ == "__main__":
    main()
