#!/usr/bin/python3
"""Bad input and overload through `tandem serve`: every case gets INVALID_ARGUMENT (naming the
field) or RESOURCE_EXHAUSTED, and a request running alongside is undisturbed."""
import concurrent.futures
import sys
import threading

import grpc

from tandem_testlib import Server, check, generate, load_stubs


def expect_error(stubs, stub, code, needle, raw=None, **kwargs):
    try:
        if raw is not None:
            call = stub._channel.unary_stream("/tandem.v1.Generation/Generate",
                                              request_serializer=lambda x: x,
                                              response_deserializer=stubs.gen.GenerateResponse.FromString)
            list(call(raw, timeout=30))
        else:
            generate(stubs, stub, **kwargs)
    except grpc.RpcError as e:
        check(e.code() == code, f"{kwargs or raw!r}: got {e.code()} {e.details()!r}, want {code}")
        check(needle in e.details(), f"{kwargs or raw!r}: message {e.details()!r} lacks {needle!r}")
        print(f"ok: {code.name}: {e.details()}")
        return
    raise AssertionError(f"{kwargs or raw!r}: no error")


class RawStub:
    def __init__(self, channel, stub):
        self._channel = channel
        self.Generate = stub.Generate


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    ids = stubs.common.TokenIds
    with Server(build_dir) as server:
        channel = grpc.insecure_channel(server.address)
        stub = RawStub(channel, stubs.gen_grpc.GenerationStub(channel))
        bystander_params = dict(temperature=0, max_tokens=300, ignore_eos=True)
        solo = generate(stubs, stub, text="Once upon a time", sampling=bystander_params)[0]["ids"]
        result = {}
        bystander = threading.Thread(target=lambda: result.update(
            out=generate(stubs, stub, text="Once upon a time", sampling=bystander_params)[0]["ids"]))
        bystander.start()

        INVALID = grpc.StatusCode.INVALID_ARGUMENT
        expect_error(stubs, stub, INVALID, "prompt", text="")
        expect_error(stubs, stub, INVALID, "prompt", token_ids=ids(ids=[]))
        expect_error(stubs, stub, INVALID, "prompt", sampling=dict(max_tokens=4))
        expect_error(stubs, stub, INVALID, "prompt", token_ids=ids(ids=[5] * 600))
        expect_error(stubs, stub, INVALID, "max_tokens", text="Hi", sampling=dict(max_tokens=100000))
        expect_error(stubs, stub, INVALID, "max_tokens", text="Hi", sampling=dict(max_tokens=-1))
        expect_error(stubs, stub, INVALID, "temperature", text="Hi", sampling=dict(temperature=-0.5))
        expect_error(stubs, stub, INVALID, "top_p", text="Hi", sampling=dict(top_p=0))
        expect_error(stubs, stub, INVALID, "top_p", text="Hi", sampling=dict(top_p=1.5))
        expect_error(stubs, stub, INVALID, "top_k", text="Hi", sampling=dict(top_k=-1))
        expect_error(stubs, stub, INVALID, "min_p", text="Hi", sampling=dict(min_p=2))
        expect_error(stubs, stub, INVALID, "repetition_penalty", text="Hi",
                     sampling=dict(repetition_penalty=0))
        expect_error(stubs, stub, INVALID, "token id 512", token_ids=ids(ids=[1, 512]))
        expect_error(stubs, stub, INVALID, "token id -3", token_ids=ids(ids=[1, -3]))
        expect_error(stubs, stub, INVALID, "stop_token_ids", text="Hi",
                     sampling=dict(stop_token_ids=[100000]))
        expect_error(stubs, stub, INVALID, "n:", text="Hi", n=17)
        expect_error(stubs, stub, INVALID, "n:", text="Hi", n=-2)
        expect_error(stubs, stub, INVALID, "stop", text="Hi", sampling=dict(stop=["x"] * 100))
        expect_error(stubs, stub, INVALID, "logprobs", text="Hi", sampling=dict(logprobs=50))
        # Field 3 (text), length 3, bytes ff fe 41: invalid UTF-8.
        expect_error(stubs, stub, INVALID, "prompt: text is not valid UTF-8", raw=bytes([0x1a, 3, 0xff, 0xfe, 0x41]))
        expect_error(stubs, stub, INVALID, "request", raw=bytes([0x1a, 50, 0x41]))  # truncated
        expect_error(stubs, stub, grpc.StatusCode.NOT_FOUND, "model", text="Hi", model="gpt-5")

        bystander.join(120)
        check(result.get("out") == solo, "the request running alongside was undisturbed")
        print("ok: bystander request identical to its solo run")

    # Overload: a queue that holds one waiting sequence, a pool too small for some requests.
    with Server(build_dir, "--max-num-seqs", "1", "--max-waiting", "1", "--num-kv-blocks", "8") as server:
        channel = grpc.insecure_channel(server.address)
        stub = RawStub(channel, stubs.gen_grpc.GenerationStub(channel))
        expect_error(stubs, stub, grpc.StatusCode.RESOURCE_EXHAUSTED, "KV blocks",
                     text="Hi", sampling=dict(max_tokens=200))

        def one(i):
            try:
                out = generate(stubs, stub, text=f"Once upon a time {i}",
                               sampling=dict(temperature=0, max_tokens=100, ignore_eos=True))
                return "ok" if len(out[0]["ids"]) == 100 else "short"
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f"{e.code()} {e.details()}")
                check("queue full" in e.details(), e.details())
                return "exhausted"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(one, range(8)))
        check("exhausted" in outcomes, f"a full queue answers RESOURCE_EXHAUSTED: {outcomes}")
        check("ok" in outcomes and "short" not in outcomes, f"accepted requests complete: {outcomes}")
        print(f"ok: overload outcomes {outcomes}")
    print("PASS")


if __name__ == "__main__":
    main()
