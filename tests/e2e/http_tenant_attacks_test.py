#!/usr/bin/python3
"""Attacks of one tenant on another through request ids, and of a keyless client on the server's
body work (issue 41), against `tandem serve --api-keys` with real clients (gRPC and HTTP):

- id squatting: tenant alpha holds a request id; tenant beta's request with the same id runs
  (no ALREADY_EXISTS, so alpha cannot learn that beta's ids exist, nor make beta's requests
  fail), and alpha's duplicates and cancellations never touch beta's request;
- predicted ids: HTTP completion ids are 128 random bits; alpha holding the ids it would predict
  from beta's last ones (the old scheme was a counter) does not make beta's next requests fail;
- no body work without a key: a keyless request is refused (401) on its headers alone: a
  malformed body gets 401, not the 400 its parsing would give; a body announced and never sent
  gets its 401 at once, not after the body timeout; a tenant past its limits gets 429 before its
  body is parsed; `tandem_http_rejected_total{reason="unauthenticated"}` counts each refusal."""
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.request

import grpc

from http_api_test import HttpServer, post_json
from tandem_testlib import check, load_stubs

BODY_TIMEOUT = 30  # a server that waited for an unsent body would answer after this


def digest(key):
    return hashlib.sha256(key.encode()).hexdigest()


def metric(port, name, label):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def raw_http(port, head, body=b"", timeout=8):
    """Sends `head` (+ body) on a fresh connection; returns (status, error message) or None."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head + body)
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        return None
    finally:
        s.close()
    if not got.startswith(b"HTTP/1.1 "):
        return None
    status = int(got[9:12])
    payload = got.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(payload)["error"]["message"] if payload else ""


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    tmp = tempfile.mkdtemp(prefix="tandem-tenants-")
    key_file = os.path.join(tmp, "keys")
    with open(key_file, "w") as f:
        f.write("tenant alpha\ntenant beta\ntenant capped max_streams=1\n"
                f"key {digest('sk-alpha')} alpha\nkey {digest('sk-beta')} beta\n"
                f"key {digest('sk-capped')} capped\n")
    metrics_file = os.path.join(tmp, "metrics-port")
    with HttpServer(build_dir, "--api-keys", key_file, "--http-body-timeout", str(BODY_TIMEOUT),
                    "--metrics-port=-1", f"--metrics-port-file={metrics_file}") as server:
        port = server.http_port
        metrics_port = int(open(metrics_file).read())
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))

        def md(key):
            return [("authorization", f"Bearer {key}")]

        def long_stream(key, request_id, n=16):
            """A request that runs for a while (every sample to the end of the context)."""
            return stub.Generate(stubs.gen.GenerateRequest(
                request_id=request_id, text="Once upon a time", n=n,
                sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=480,
                                                       ignore_eos=True)),
                metadata=md(key), timeout=120)

        def short(key, request_id):
            """(status code, tokens) of a short request."""
            try:
                rs = list(stub.Generate(stubs.gen.GenerateRequest(
                    request_id=request_id, text="Once upon a time",
                    sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=8,
                                                           ignore_eos=True)),
                    metadata=md(key), timeout=60))
                return grpc.StatusCode.OK, sum(len(r.chunk.token_ids) for r in rs)
            except grpc.RpcError as e:
                return e.code(), 0

        def tokens_left(stream):
            return sum(len(r.chunk.token_ids) for r in stream if r.HasField("chunk"))

        # 1. Squatting a client-chosen id across tenants (gRPC). Alpha's own duplicate, refused
        # before and after beta's request, proves alpha's request was running throughout.
        for attempt in range(3):
            held = long_stream("sk-alpha", "job-7")
            next(held)
            dup_before = short("sk-alpha", "job-7")[0]
            beta = short("sk-beta", "job-7")
            dup_after = short("sk-alpha", "job-7")[0]
            held.cancel()
            if dup_after == grpc.StatusCode.ALREADY_EXISTS:
                break
            print(f"attempt {attempt}: alpha's request ended before beta's was done; again")
        check(dup_before == dup_after == grpc.StatusCode.ALREADY_EXISTS,
              f"a tenant's own running id is refused: {dup_before} {dup_after}")
        check(beta == (grpc.StatusCode.OK, 8),
              f"beta's request with alpha's id must run (nothing tells beta alpha's id exists): "
              f"{beta}")
        print("ok: the same request id in two tenants: both run; a tenant's own duplicate is "
              "refused")

        # Alpha's duplicates of beta's running id, cancelled at once, never cancel beta's.
        victim = long_stream("sk-beta", "job-9", n=4)
        next(victim)
        for _ in range(10):
            stub.Generate(stubs.gen.GenerateRequest(
                request_id="job-9", text="Hi",
                sampling=stubs.sampling.SamplingParams(max_tokens=4)),
                metadata=md("sk-alpha"), timeout=60).cancel()
            # Alpha's own cancelled call may still hold 'job-9' in alpha's namespace for a moment
            # (its cancellation races the next call); beta's running 'job-9' never does.
            deadline = time.monotonic() + 10
            code = short("sk-alpha", "job-9")[0]
            while code == grpc.StatusCode.ALREADY_EXISTS and time.monotonic() < deadline:
                time.sleep(0.05)
                code = short("sk-alpha", "job-9")[0]
            check(code == grpc.StatusCode.OK, f"alpha's 'job-9' runs in its own namespace: {code}")
        n = tokens_left(victim)
        check(n >= 4 * 480 - 4, f"beta's request completes untouched: {n} more tokens")
        print("ok: another tenant's duplicates and cancellations never reach a request")

        # 2. Predicted HTTP ids. Beta's completion ids are random; alpha holds (over gRPC) every
        # id a counter-based scheme would give beta next, then beta's next requests must pass.
        ids = []
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/completions"):
            body = {"max_tokens": 4, "temperature": 0}
            if "chat" in path:
                body["messages"] = [{"role": "user", "content": "Hi"}]
            else:
                body["prompt"] = "Once upon a time"
            status, r = post_json(port, path, body, headers={"Authorization": "Bearer sk-beta"})
            check(status == 200, f"beta {path}: {status} {r}")
            ids.append(r["id"])
        for rid in ids:
            check(re.fullmatch(r"(chat)?cmpl-[0-9a-f]{32}", rid), f"unpredictable id: {rid!r}")
        check(len(set(ids)) == len(ids), f"distinct ids: {ids}")
        predicted = set()
        for rid in ids:
            bare = rid.split("-", 1)[1]
            m = re.fullmatch(r"(.*?)(\d+)", bare)
            if m is None:
                continue
            for step in range(1, 7):
                nxt = f"{m.group(1)}{int(m.group(2)) + step}"
                predicted.add(nxt)
                predicted.add(f"{'chatcmpl' if 'chat' in rid else 'cmpl'}-{nxt}")
            # The old scheme: "http-<unix seconds>-<serial>"; the seconds move on.
            t = re.fullmatch(r"http-(\d+)-(\d+)", bare)
            if t:
                for dt in range(0, 4):
                    for step in range(1, 7):
                        predicted.add(f"http-{int(t.group(1)) + dt}-{int(t.group(2)) + step}")
        squats = [long_stream("sk-alpha", p, n=1) for p in sorted(predicted)[:64]]
        for s in squats:
            next(s)
        for i in range(3):
            status, r = post_json(port, "/v1/completions",
                                  {"prompt": "Once upon a time", "max_tokens": 4},
                                  headers={"Authorization": "Bearer sk-beta"})
            check(status == 200, f"beta's request {i} with alpha squatting predicted ids: "
                                 f"{status} {r}")
        for s in squats:
            s.cancel()
        print(f"ok: HTTP ids are random ({ids[0]}); {len(predicted)} predicted ids held by "
              "another tenant fail none of the next requests")

        # 3. No body work before the key is checked.
        before = metric(metrics_port, "tandem_http_rejected_total", 'reason="unauthenticated"')
        r = raw_http(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 9\r\n\r\n",
                     b"{not json")
        check(r is not None and r[0] == 401,
              f"a keyless malformed body: 401 from the headers, not a parse error: {r}")
        t0 = time.monotonic()
        r = raw_http(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Authorization: Bearer sk-wrong\r\nContent-Length: 3000000\r\n\r\n")
        check(r is not None and r[0] == 401,
              f"a body announced and never sent: the 401 comes without it: {r}")
        print(f"ok: a keyless request is refused on its headers ({time.monotonic() - t0:.2f} s "
              f"for an unsent 3 MB body; the body timeout is {BODY_TIMEOUT} s)")
        big = json.dumps({"messages": [{"role": "user", "content": "word " * 100}] * 5000,
                          "max_tokens": 1}).encode()
        r = raw_http(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + str(len(big)).encode() + b"\r\n\r\n", big)
        check(r is not None and r[0] == 401, f"a 3 MB chat body without a key: {r}")
        after = metric(metrics_port, "tandem_http_rejected_total", 'reason="unauthenticated"')
        check(after - before == 3, f"each refused on its headers: {before} -> {after}")

        # A tenant at its limit: 429 before its body is parsed.
        running = long_stream("sk-capped", "", n=4)
        next(running)
        r = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Authorization: Bearer sk-capped\r\nContent-Length: 9\r\n\r\n",
                     b"{not json")
        check(r is not None and r[0] == 429 and "concurrent" in r[1],
              f"a tenant at its stream limit: 429 before its body is parsed: {r}")
        running.cancel()
        status, r = post_json(port, "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                              headers={"Authorization": "Bearer sk-alpha"})
        check(status == 200, f"an honest request is served: {status} {r}")
        print("ok: no parsing, rendering or tokenizing for a keyless request or a tenant past "
              "its limits")
    print("PASS")


if __name__ == "__main__":
    main()
