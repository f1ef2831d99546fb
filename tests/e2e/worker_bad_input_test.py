#!/usr/bin/python3
"""Bad input on the worker API, as a buggy or hostile router could send it: malformed
frames, impossible reservations (negative, huge and mismatched block lists, an absurd first
block, unreachable or garbage KV endpoints, a stale incarnation, a transfer nobody expects),
migrations that cannot be, leases that expire, prefill asked of a decode worker and the other way
round. Each gets a defined status, neither worker crashes, and afterwards neither holds a KV
block, reservation, transfer or sequence; the cluster still serves identical output."""
import sys
import time

import grpc

import bad_input_corpus as corpus
from tandem_testlib import Cluster, attempt_target, check, load_stubs, wait_no_leaks

DEFINED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS",
           "FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "UNIMPLEMENTED",
           "DATA_LOSS", "CANCELLED"}


def decode_call(stubs, channel, payload, timeout=30):
    """Runs Worker.Decode; returns (grpc code, final error code name or "", responses)."""
    raw = channel.unary_stream("/tandem.v1.Worker/Decode", request_serializer=lambda x: x,
                               response_deserializer=stubs.worker.DecodeResponse.FromString)
    if not isinstance(payload, bytes):
        payload = payload.SerializeToString()
    out = []
    try:
        for r in raw(payload, timeout=timeout):
            out.append(r)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    err = ""
    for r in out:
        if r.HasField("final") and r.final.error_code:
            err = grpc.StatusCode(
                [c for c in grpc.StatusCode if c.value[0] == r.final.error_code][0]).name
    return code, err, out


def prefill_call(stubs, channel, payload, timeout=30):
    raw = channel.unary_unary("/tandem.v1.Worker/Prefill", request_serializer=lambda x: x,
                              response_deserializer=stubs.worker.PrefillResponse.FromString)
    if not isinstance(payload, bytes):
        payload = payload.SerializeToString()
    try:
        raw(payload, timeout=timeout)
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def check_malformed_frames(channel):
    """Every Worker method answers a frame that does not parse with INVALID_ARGUMENT naming the
    message type (the service takes its requests raw), and the worker keeps serving."""
    for method, message, streaming in [("GetInfo", "InfoRequest", False),
                                       ("Decode", "DecodeRequest", True),
                                       ("Prefill", "PrefillRequest", False),
                                       ("Cancel", "CancelRequest", False),
                                       ("GetStats", "StatsRequest", False),
                                       ("WatchStats", "StatsRequest", True)]:
        for name, frame in [("truncated", b"\x12\x05\x01"), ("bad tag", b"\xff\xff\xff\xff"),
                            ("invalid UTF-8 string", b"\x0a\x02\xc3\x28")]:
            path = f"/tandem.v1.Worker/{method}"
            call = (channel.unary_stream if streaming else channel.unary_unary)(
                path, request_serializer=lambda x: x, response_deserializer=lambda x: x)
            try:
                result = call(frame, timeout=2 if streaming else 10)
                if streaming:
                    list(result)
                code, details = "OK", ""
            except grpc.RpcError as e:
                code, details = e.code().name, e.details() or ""
            if message in ("InfoRequest", "StatsRequest") and name == "invalid UTF-8 string":
                # Field 1 is unknown to these empty messages: skipped, a valid request.
                ok = code == "OK" or (streaming and code == "DEADLINE_EXCEEDED")
                check(ok, f"{method} {name}: {code} {details!r}")
                continue
            check(code == "INVALID_ARGUMENT" and f"tandem.v1.{message}" in details,
                  f"{method} {name}: got {code} {details!r}, want INVALID_ARGUMENT naming "
                  f"tandem.v1.{message}")


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    w = stubs.worker
    with Cluster(build_dir, 1, 1, "--disagg-min-uncached-tokens", "0", "--threads", "1") as cluster:
        chans = cluster.worker_channels()
        p, d = chans["prefill"][0], chans["decode"][0]
        info = stubs.worker_grpc.WorkerStub(d).GetInfo(w.InfoRequest(), timeout=10)
        gen = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(cluster.address))
        params = stubs.sampling.SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        want = [t for r in gen.Generate(stubs.gen.GenerateRequest(text="Once upon a time",
                                                                   sampling=params))
                if r.HasField("chunk") for t in r.chunk.token_ids]

        prompt = list(range(1, 40))  # 39 tokens: 3 blocks of 16
        sp = stubs.sampling.SamplingParams(max_tokens=4)

        # Decode: malformed frames and impossible requests.
        for name, payload, want_code, want_err in [
            ("truncated frame", b"\x12\x05\x01", "INVALID_ARGUMENT", ""),
            ("empty request", b"", "OK", "INVALID_ARGUMENT"),
            ("no prompt", w.DecodeRequest(request_id="a", sampling=sp), "OK", "INVALID_ARGUMENT"),
            ("token id 512", w.DecodeRequest(request_id="b", prompt_token_ids=[1, 512],
                                             sampling=sp), "OK", "INVALID_ARGUMENT"),
            ("n 17", w.DecodeRequest(request_id="c", prompt_token_ids=prompt, n=17, sampling=sp),
             "OK", "INVALID_ARGUMENT"),
            ("n -3", w.DecodeRequest(request_id="c2", prompt_token_ids=prompt, n=-3, sampling=sp),
             "OK", "INVALID_ARGUMENT"),
            ("prior output with n 2", w.DecodeRequest(request_id="d", prompt_token_ids=prompt, n=2,
                                                      prior_output_token_ids=[5], sampling=sp),
             "OK", "INVALID_ARGUMENT"),
            ("prior output of max_tokens", w.DecodeRequest(
                request_id="e", prompt_token_ids=prompt, prior_output_token_ids=[5] * 4,
                sampling=sp), "OK", "INVALID_ARGUMENT"),
            ("prior output outside the vocabulary", w.DecodeRequest(
                request_id="f", prompt_token_ids=prompt, prior_output_token_ids=[-1],
                sampling=sp), "OK", "INVALID_ARGUMENT"),
            ("logprobs -1", w.DecodeRequest(request_id="g", prompt_token_ids=prompt,
                                            sampling=stubs.sampling.SamplingParams(logprobs=-1)),
             "OK", "INVALID_ARGUMENT"),
            ("negative lease", w.DecodeRequest(request_id="h", prompt_token_ids=prompt,
                                               sampling=sp, kv_lease_ms=-5), "OK", ""),
        ]:
            code, err, _ = decode_call(stubs, d, payload)
            check(code == want_code and err == want_err,
                  f"decode {name}: got {code}/{err}, want {want_code}/{want_err}")
        code, err, _ = decode_call(stubs, p, w.DecodeRequest(
            request_id="i", prompt_token_ids=prompt, sampling=sp))
        check(code == "UNIMPLEMENTED", f"decode on a prefill worker: {code} {err}")
        check_malformed_frames(p)
        check_malformed_frames(d)

        # A reservation nobody fills expires after its lease and frees its blocks.
        t = time.time()
        code, err, out = decode_call(stubs, d, w.DecodeRequest(
            request_id="lease", prompt_token_ids=prompt, sampling=sp, remote_prefill=True,
            kv_lease_ms=300))
        check(out and out[0].HasField("reservation"), f"reservation first: {out[:1]}")
        check(code == "OK" and err in DEFINED - {"OK"}, f"expired lease: {code}/{err}")
        check(time.time() - t < 10, "the lease expired on time")
        print(f"ok: decode worker: malformed and impossible requests; a lease expires ({err})")

        # Prefill: impossible reservations. The real reservation of a live request first.
        res_req = w.DecodeRequest(request_id="res", prompt_token_ids=prompt, sampling=sp,
                                  remote_prefill=True, kv_lease_ms=20000)
        raw = d.unary_stream("/tandem.v1.Worker/Decode",
                             request_serializer=lambda x: x.SerializeToString(),
                             response_deserializer=w.DecodeResponse.FromString)
        held = raw(res_req, timeout=60)
        res = next(held).reservation

        def target(**kw):
            t = w.KvReservation()
            t.CopyFrom(res)
            for k, v in kw.items():
                if k == "dst_blocks":
                    del t.dst_blocks[:]
                    t.dst_blocks.extend(v)
                else:
                    setattr(t, k, v)
            return t

        n = len(res.dst_blocks)
        cases = [
            ("truncated frame", b"\x12\x05\x01", {"INVALID_ARGUMENT"}),
            ("no target", w.PrefillRequest(request_id="p0", prompt_token_ids=prompt,
                                           sampling=sp), {"INVALID_ARGUMENT"}),
            ("first_block int32 max", target(first_block=2**31 - 1), {"INVALID_ARGUMENT"}),
            ("first_block negative", target(first_block=-1), {"INVALID_ARGUMENT"}),
            ("one block too many", target(dst_blocks=list(res.dst_blocks) + [0]),
             {"INVALID_ARGUMENT"}),
            ("one block too few", target(dst_blocks=list(res.dst_blocks)[:-1]),
             {"INVALID_ARGUMENT"}),
            ("negative block ids", target(dst_blocks=[-1] * n), {"INVALID_ARGUMENT", "NOT_FOUND"}),
            ("huge block ids", target(dst_blocks=[2**31 - 1] * n),
             {"INVALID_ARGUMENT", "NOT_FOUND"}),
            ("foreign block ids", target(dst_blocks=[(b + 7) % 64 for b in res.dst_blocks]),
             {"INVALID_ARGUMENT"}),
            ("stale incarnation", target(incarnation=res.incarnation + 1),
             {"FAILED_PRECONDITION"}),
            ("unknown transfer", target(transfer_id=res.transfer_id ^ 0x5555),
             {"NOT_FOUND", "ABORTED"}),
            ("unreachable endpoint", target(kv_endpoint="127.0.0.1:1"), {"UNAVAILABLE"}),
            ("garbage endpoint", target(kv_endpoint=":::not an endpoint"),
             {"UNAVAILABLE", "INVALID_ARGUMENT"}),
            ("empty endpoint", target(kv_endpoint=""), {"UNAVAILABLE", "INVALID_ARGUMENT"}),
            ("endpoint of 64 KiB", target(kv_endpoint="h" * 65536 + ":1"), {"INVALID_ARGUMENT"}),
            ("transport it does not speak", target(kv_transport="nccl"), {"INVALID_ARGUMENT"}),
            ("transport of 64 KiB", target(kv_transport="t" * 65536), {"INVALID_ARGUMENT"}),
        ]
        for i, (name, tgt, codes) in enumerate(cases):
            payload = tgt if isinstance(tgt, bytes) else tgt if isinstance(
                tgt, w.PrefillRequest) else w.PrefillRequest(
                    request_id=f"pf{i}", prompt_token_ids=prompt, sampling=sp,
                    target=attempt_target(tgt, i + 1), attempt=i + 1)
            code, details = prefill_call(stubs, p, payload)
            check(code in codes, f"prefill {name}: got {code} {details!r}, want {codes}")
        code, details = prefill_call(stubs, d, w.PrefillRequest(
            request_id="pd", prompt_token_ids=prompt, sampling=sp, target=res))
        check(code in {"FAILED_PRECONDITION", "UNIMPLEMENTED"}, f"prefill on decode: {code}")
        # After all that, the reservation can still be filled and decoded.
        code, details = prefill_call(stubs, p, w.PrefillRequest(
            request_id="res", prompt_token_ids=prompt, sampling=sp,
            target=attempt_target(res, 100), attempt=100))
        check(code == "OK", f"the real prefill after the bad ones: {code} {details}")
        rest = list(held)
        check(any(r.HasField("final") and r.final.finish_reason ==
                  stubs.common.FINISH_REASON_LENGTH for r in rest), f"decoded: {rest[-1:]}")
        print(f"ok: prefill worker: {len(cases)} impossible reservations refused; the real one "
              "still completes")

        # Cancel and stats with odd ids.
        wk = stubs.worker_grpc.WorkerStub(d)
        for rid, idx in [("", -1), ("nope", 5), ("x" * 100000, -(2**31)), ("res", 2**31 - 1)]:
            wk.Cancel(w.CancelRequest(request_id=rid, index=idx), timeout=10)
        # Random bytes to every worker method.
        rng = corpus.seeded(3)
        for method in ("GetInfo", "Decode", "Prefill", "Cancel", "GetStats"):
            for ch in (p, d):
                call = ch.unary_stream if method == "Decode" else ch.unary_unary
                stub = call(f"/tandem.v1.Worker/{method}", request_serializer=lambda x: x,
                            response_deserializer=lambda x: x)
                for _ in range(30):
                    try:
                        r = stub(corpus.random_bytes(rng, rng.randint(0, 64)), timeout=30)
                        if method == "Decode":
                            list(r)
                    except grpc.RpcError as e:
                        check(e.code().name in DEFINED, f"{method}: {e.code()} {e.details()}")
        print("ok: random bytes to every worker method")

        wait_no_leaks(stubs, [p, d], timeout=30)
        got = [t for r in gen.Generate(stubs.gen.GenerateRequest(text="Once upon a time",
                                                                 sampling=params))
               if r.HasField("chunk") for t in r.chunk.token_ids]
        check(got == want, "the cluster still serves identical output")
        check(all(pid > 0 for pid, _ in cluster.children()["prefill"]), "workers alive")
        logs = cluster.logs()
        check("restarting" not in logs and "died" not in logs, f"no worker died:\n{logs[-3000:]}")
        for marker in ("check failed", "AddressSanitizer", "runtime error:", "terminate called"):
            check(marker not in logs, f"log has {marker!r}")
        print(f"ok: no leaks; info {info.role} {info.kv_endpoint}")
    print("PASS")


if __name__ == "__main__":
    main()
