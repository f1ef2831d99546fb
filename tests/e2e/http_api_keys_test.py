#!/usr/bin/python3
"""API keys and tenants at the router (`tandem serve --api-keys`), over HTTP and gRPC: a
missing, wrong or revoked (removed + SIGHUP) key gets 401 / UNAUTHENTICATED; a tenant past its
requests-per-minute, tokens-per-minute or concurrent-stream limit gets 429 / RESOURCE_EXHAUSTED
while another tenant is served; two tenants sending the same prompt never share cached blocks
(the second reports 0 cached tokens) while the same tenant does, with identical outputs."""
import hashlib
import http.client
import os
import signal
import sys
import tempfile
import time

import grpc

from http_api_test import HttpServer, post_json
from tandem_testlib import check, generate, load_stubs


def digest(key):
    return hashlib.sha256(key.encode()).hexdigest()


def write_keys(path, keys, revoked=()):
    lines = ["# tenants and their limits",
             "tenant acme requests_per_minute=1000",
             "tenant zeta",
             "tenant slow requests_per_minute=3",
             "tenant tiny tokens_per_minute=40",
             "tenant solo max_streams=1"]
    for key, tenant in keys.items():
        if key not in revoked:
            lines.append(f"key {digest(key)} {tenant}")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    tmp = tempfile.mkdtemp(prefix="tandem-keys-")
    key_file = os.path.join(tmp, "keys")
    keys = {"sk-acme-1": "acme", "sk-acme-old": "acme", "sk-zeta": "zeta", "sk-slow": "slow",
            "sk-tiny": "tiny", "sk-solo": "solo"}
    write_keys(key_file, keys)
    with HttpServer(build_dir, "--api-keys", key_file) as server:
        port = server.http_port
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))
        req = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}

        def call(key, body=req, path="/v1/completions"):
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            return post_json(port, path, body, headers=headers)

        def grpc_gen(key, **kw):
            md = [("authorization", f"Bearer {key}")] if key is not None else []
            request = stubs.gen.GenerateRequest(
                text="Once upon a time",
                sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=8), **kw)
            return list(stub.Generate(request, metadata=md, timeout=60))

        def grpc_code(key, **kw):
            try:
                grpc_gen(key, **kw)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

        # 401: missing, wrong, malformed.
        for key in (None, "sk-wrong", ""):
            status, body = call(key)
            check(status == 401 and body["error"]["type"] == "authentication_error",
                  f"key {key!r}: {status} {body}")
            check(grpc_code(key) == grpc.StatusCode.UNAUTHENTICATED, f"gRPC key {key!r}")
        status, body = post_json(port, "/v1/completions", req, headers={"Authorization": "sk-acme-1"})
        check(status == 401 and "Bearer" in body["error"]["message"], f"no Bearer: {body}")
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/v1/models")
        check(conn.getresponse().status == 401, "/v1/models needs a key too")
        print("ok: missing / wrong / malformed keys get 401 and UNAUTHENTICATED")

        status, ok_body = call("sk-acme-1")
        check(status == 200, f"valid key: {status} {ok_body}")
        check(grpc_code("sk-acme-1") == grpc.StatusCode.OK, "gRPC with a valid key")
        check(call("sk-acme-old")[0] == 200, "second acme key")

        # Revocation: rewrite the file without the key, SIGHUP.
        write_keys(key_file, keys, revoked=("sk-acme-old",))
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 15
        while call("sk-acme-old")[0] != 401:
            check(time.time() < deadline, "revoked key still accepted after SIGHUP")
            time.sleep(0.1)
        check(grpc_code("sk-acme-old") == grpc.StatusCode.UNAUTHENTICATED, "revoked over gRPC")
        check(call("sk-acme-1")[0] == 200 and server.proc.poll() is None, "others still served")
        print("ok: a key removed from the file and SIGHUP gives 401")

        # Requests per minute: 3 for "slow".
        for i in range(3):
            check(call("sk-slow")[0] == 200, f"slow request {i}")
        status, body = call("sk-slow")
        check(status == 429 and "requests per minute" in body["error"]["message"], f"{status} {body}")
        check(grpc_code("sk-slow") == grpc.StatusCode.RESOURCE_EXHAUSTED, "gRPC rate limit")
        check(call("sk-zeta")[0] == 200 and call("sk-acme-1")[0] == 200, "other tenants served")
        print("ok: a tenant over its request rate gets 429 / RESOURCE_EXHAUSTED, others are served")

        # Tokens per minute: 40 for "tiny" (5 prompt + 48 generated tokens exceed it).
        status, body = call("sk-tiny", {**req, "max_tokens": 48, "ignore_eos": True})
        check(status == 200, f"tiny first: {body}")
        status, body = call("sk-tiny")
        check(status == 429 and "tokens per minute" in body["error"]["message"], f"{status} {body}")
        print("ok: tokens-per-minute limit")

        # Concurrent streams: 1 for "solo".
        long_call = stub.Generate(stubs.gen.GenerateRequest(
            text="Once upon a time",
            sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)),
            metadata=[("authorization", "Bearer sk-solo")])
        next(iter(long_call))  # running
        status, body = call("sk-solo")
        check(status == 429 and "concurrent" in body["error"]["message"], f"{status} {body}")
        long_call.cancel()
        deadline = time.time() + 15
        while call("sk-solo")[0] != 200:
            check(time.time() < deadline, "solo not admitted after its stream ended")
            time.sleep(0.1)
        print("ok: concurrent-stream limit")

        # Prefix-cache isolation between tenants: 256-token prompt, same tokens.
        prompt = [1] + [(11 * i) % 500 + 3 for i in range(255)]
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        s1, a1 = call("sk-acme-1", body)
        s2, a2 = call("sk-acme-1", body)
        s3, z1 = call("sk-zeta", body)
        s4, z2 = call("sk-zeta", body)
        check(s1 == s2 == s3 == s4 == 200, f"{s1} {s2} {s3} {s4}")

        def cached(r):
            return r["usage"]["prompt_tokens_details"]["cached_tokens"]

        check(cached(a1) == 0, f"acme cold: {a1['usage']}")
        check(cached(a2) >= 240, f"acme shares its own prefix: {a2['usage']}")
        check(cached(z1) == 0, f"zeta must not hit acme's blocks: {z1['usage']}")
        check(cached(z2) >= 240, f"zeta shares its own prefix: {z2['usage']}")
        texts = {r["choices"][0]["text"] for r in (a1, a2, z1, z2)}
        check(len(texts) == 1, f"same output for every tenant: {texts}")
        # The gRPC API is keyed the same way: acme's key over gRPC hits acme's blocks.
        g = [r for r in stub.Generate(stubs.gen.GenerateRequest(
            token_ids=stubs.common.TokenIds(ids=prompt),
            sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)),
            metadata=[("authorization", "Bearer sk-acme-1")]) if r.HasField("final")]
        check(g[0].final.usage.cached_tokens >= 240, f"gRPC acme: {g[0].final.usage}")
        print(f"ok: tenants never share cached blocks ({cached(a2)} cached within a tenant, 0 across)")

        # A client's cache_salt (HTTP, as vLLM's) separates its own prefixes, and whatever salt
        # a tenant sends, the server puts the tenant in front of it: no salt reaches another
        # tenant's blocks.
        prompt2 = [1] + [(13 * i) % 500 + 3 for i in range(255)]
        body2 = {"prompt": prompt2, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        _, a = call("sk-acme-1", {**body2, "cache_salt": "s1"})
        _, a_again = call("sk-acme-1", {**body2, "cache_salt": "s1"})
        _, a_other = call("sk-acme-1", {**body2, "cache_salt": "s2"})
        check(cached(a) == 0 and cached(a_again) >= 240 and cached(a_other) == 0,
              f"acme's salts: {a['usage']} {a_again['usage']} {a_other['usage']}")
        for forged in ("s1", "acme", "tenant\x1facme\x1fs1", "\x1facme\x1fs1"):
            status, z = call("sk-zeta", {**body2, "cache_salt": forged})
            check(status == 200 and cached(z) == 0, f"zeta with salt {forged!r}: {z}")
        print("ok: cache_salt separates a tenant's prefixes; no salt reaches another tenant's")
    print("PASS")


if __name__ == "__main__":
    main()
