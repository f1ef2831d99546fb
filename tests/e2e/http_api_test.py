#!/usr/bin/python3
"""The OpenAI-compatible HTTP API of `tandem serve` with real clients: Debian's curl and a
Python standard-library client that parses the server-sent events itself. Completions and chat,
streaming and not, give the same tokens as the gRPC API for the same request; n, seed, stop,
logprobs and usage behave; /v1/models lists the model; every malformed body gets a 400 (or 404 /
413) with an OpenAI error message; a client that disconnects cancels its request."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

import grpc

from tandem_testlib import Server, check, generate, load_stubs, serve_stats


class HttpServer(Server):
    """`tandem serve` with the HTTP API on a free port."""

    def __init__(self, build_dir, *args, **kwargs):
        import tempfile
        self.http_tmp = tempfile.mkdtemp(prefix="tandem-http-")
        self.http_port_file = os.path.join(self.http_tmp, "http_port")
        super().__init__(build_dir, "--http-port", "0", "--http-port-file", self.http_port_file,
                         *args, **kwargs)
        deadline = time.time() + 30
        while not os.path.exists(self.http_port_file):
            check(time.time() < deadline and self.proc.poll() is None,
                  f"no HTTP port:\n{self.logs()}")
            time.sleep(0.05)
        self.http_port = int(open(self.http_port_file).read())


def post(port, path, body, headers=None, raw=None):
    """Standard-library client: returns (status, headers, bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    conn.close()
    return out


def post_json(port, path, body, **kw):
    status, headers, data = post(port, path, body, **kw)
    return status, json.loads(data)


def sse_events(port, path, body):
    """Streams a request; returns the parsed `data:` payloads and whether [DONE] ended them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise AssertionError(f"stream status {r.status}: {r.read()!r}")
    check(r.getheader("Content-Type", "").startswith("text/event-stream"), "SSE content type")
    events, done = [], False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data: "):
            payload = line[len(b"data: "):]
            if payload == b"[DONE]":
                done = True
            else:
                check(not done, "no event after [DONE]")
                events.append(json.loads(payload))
        # blank lines separate events; ':' lines are comments (keep-alives)
    conn.close()
    return events, done


def curl_json(port, path, body, *extra):
    out = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                          "--data-binary", json.dumps(body), *extra,
                          f"http://127.0.0.1:{port}{path}"],
                         check=True, capture_output=True, timeout=120).stdout.decode()
    text, code = out.rsplit("\n", 1)
    return int(code), json.loads(text)


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    with HttpServer(build_dir) as server:
        channel = grpc.insecure_channel(server.address)
        stub = stubs.gen_grpc.GenerationStub(channel)
        port = server.http_port
        prompt = "Once upon a time"
        ref = generate(stubs, stub, text=prompt, sampling=dict(temperature=0, max_tokens=24))[0]

        # Completions, curl, not streamed.
        code, body = curl_json(port, "/v1/completions",
                               {"prompt": prompt, "max_tokens": 24, "temperature": 0})
        check(code == 200, f"curl completion: {code} {body}")
        check(body["object"] == "text_completion" and body["id"].startswith("cmpl-"), str(body))
        check(body["choices"][0]["text"] == ref["text"],
              f"HTTP {body['choices'][0]['text']!r} != gRPC {ref['text']!r}")
        usage = body["usage"]
        check(usage["completion_tokens"] == len(ref["ids"]) == ref["final"].usage.completion_tokens,
              f"usage {usage}")
        check(usage["prompt_tokens"] == ref["final"].usage.prompt_tokens, f"usage {usage}")
        check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "total")
        check(body["choices"][0]["finish_reason"] == "length", str(body))
        print("ok: curl completion equals gRPC:", repr(ref["text"]))

        # Completions, streamed, standard-library client.
        events, done = sse_events(port, "/v1/completions",
                                  {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                   "stream": True, "stream_options": {"include_usage": True}})
        check(done, "stream ends with data: [DONE]")
        text = "".join(c["text"] for e in events for c in e["choices"])
        check(text == ref["text"], f"streamed {text!r} != gRPC {ref['text']!r}")
        check(events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 24,
              f"usage chunk last: {events[-1]}")
        check(all(e["usage"] is None for e in events[:-1]), "usage null before the last chunk")
        check(events[-2]["choices"][0]["finish_reason"] == "length", str(events[-2]))
        print(f"ok: streamed completion ({len(events)} events) equals gRPC, usage chunk last")

        # Chat: stories260k has no chat template, so the built-in llama-2 one renders it.
        messages = [{"role": "system", "content": "Be kind."},
                    {"role": "user", "content": "Tell me about a cat."}]
        rendered = "<s>[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nTell me about a cat. [/INST]"
        chat_ref = generate(stubs, stub, text=rendered, add_special_tokens=False,
                            sampling=dict(temperature=0, max_tokens=20))[0]
        code, body = curl_json(port, "/v1/chat/completions",
                               {"messages": messages, "max_tokens": 20, "temperature": 0})
        check(code == 200, f"chat: {code} {body}")
        msg = body["choices"][0]["message"]
        check(msg["role"] == "assistant" and msg["content"] == chat_ref["text"],
              f"chat {msg!r} != gRPC {chat_ref['text']!r}")
        check(body["usage"]["prompt_tokens"] == chat_ref["final"].usage.prompt_tokens, "chat usage")
        check(body["object"] == "chat.completion", str(body))
        events, done = sse_events(port, "/v1/chat/completions",
                                  {"messages": messages, "max_completion_tokens": 20,
                                   "temperature": 0, "stream": True})
        check(done, "chat stream ends with [DONE]")
        check(events[0]["choices"][0]["delta"].get("role") == "assistant", "first delta has role")
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        check(text == chat_ref["text"], f"chat stream {text!r} != {chat_ref['text']!r}")
        check(all("usage" not in e for e in events), "no usage without include_usage")
        print("ok: chat (llama-2 template) equals gRPC, streamed and not:", repr(chat_ref["text"]))

        # n, seed, temperature/top_p, presence/frequency penalties, user.
        sampled = dict(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16,
                       presence_penalty=0.5, frequency_penalty=0.3)
        req = {"prompt": prompt, "n": 2, "user": "alice", **sampled}
        s1, a = post_json(port, "/v1/completions", req)
        s2, b = post_json(port, "/v1/completions", req)
        check(s1 == s2 == 200, f"{s1} {a}")
        check([c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]],
              "same seed, same samples")
        check(len(a["choices"]) == 2 and a["usage"]["completion_tokens"] == 32, str(a["usage"]))
        g = generate(stubs, stub, text=prompt, n=2, sampling=sampled)
        check([g[0]["text"], g[1]["text"]] == [c["text"] for c in a["choices"]],
              "seeded samples equal gRPC's")
        print("ok: n=2 with a seed is reproducible and equals gRPC")

        # stop strings.
        stop = ref["text"][5:9]
        code, body = post_json(port, "/v1/completions",
                               {"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": [stop]})
        want = ref["text"][:ref["text"].find(stop)]
        check(body["choices"][0]["text"] == want and body["choices"][0]["finish_reason"] == "stop",
              f"stop {stop!r}: {body['choices'][0]}")
        print(f"ok: stop {stop!r}")

        # logprobs: completions (int) and chat (bool + top_logprobs) match gRPC's values.
        lp_ref = generate(stubs, stub, text=prompt,
                          sampling=dict(temperature=0, max_tokens=6, logprobs=2))
        code, body = post_json(port, "/v1/completions",
                               {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2})
        lp = body["choices"][0]["logprobs"]
        check(len(lp["tokens"]) == 6 and all(len(t) == 2 for t in lp["top_logprobs"]), str(lp))
        grpc_lps = []
        for r in stub.Generate(stubs.gen.GenerateRequest(
                text=prompt, sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=6,
                                                                    logprobs=2))):
            if r.HasField("chunk"):
                grpc_lps += [x.chosen.logprob for x in r.chunk.logprobs]
        check(all(abs(x - y) < 1e-5 for x, y in zip(lp["token_logprobs"], grpc_lps)) and
              len(grpc_lps) == 6, f"{lp['token_logprobs']} vs {grpc_lps}")
        check("".join(lp["tokens"]) == body["choices"][0]["text"], "tokens spell the text")
        code, body = post_json(port, "/v1/chat/completions",
                               {"messages": messages, "max_tokens": 4, "temperature": 0,
                                "logprobs": True, "top_logprobs": 3})
        content = body["choices"][0]["logprobs"]["content"]
        check(len(content) == 4 and all(len(c["top_logprobs"]) == 3 for c in content), str(content))
        print("ok: logprobs")

        # /v1/models
        out = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{port}/v1/models"], check=True,
                             capture_output=True).stdout
        models = json.loads(out)
        check(models["object"] == "list" and models["data"][0]["object"] == "model", str(models))
        model_id = models["data"][0]["id"]
        code, body = post_json(port, "/v1/completions",
                               {"model": model_id, "prompt": prompt, "max_tokens": 2})
        check(code == 200, f"named model: {body}")
        print("ok: /v1/models lists", model_id)

        # Malformed requests: each a 4xx with an OpenAI error message.
        deep = "[" * 10000 + "]" * 10000
        bad = [
            (b"", 400, "empty"),
            (b"not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "JSON object"),
            (b'{"prompt": "x", ', 400, "not valid JSON"),
            (('{"prompt": ' + deep + '}').encode(), 400, "nests deeper"),
            (b'{"prompt": "\xff\xfe"}', 400, "not valid JSON"),
            (b'{"prompt": "\\ud800"}', 400, "not valid JSON"),
            (json.dumps({"prompt": prompt, "temperature": "hot"}).encode(), 400, "temperature"),
            (json.dumps({"prompt": prompt, "temperature": 5}).encode(), 400, "temperature"),
            (json.dumps({"prompt": prompt, "max_tokens": 0}).encode(), 400, "max_tokens"),
            (json.dumps({"prompt": prompt, "max_tokens": 10 ** 30}).encode(), 400, "max_tokens"),
            (json.dumps({"prompt": prompt, "n": 0}).encode(), 400, "n:"),
            (json.dumps({"prompt": prompt, "n": 100}).encode(), 400, "n:"),
            (json.dumps({"prompt": prompt, "stop": 3}).encode(), 400, "stop"),
            (json.dumps({"prompt": prompt, "stop": [""]}).encode(), 400, "stop"),
            (json.dumps({"prompt": prompt, "echo": True}).encode(), 400, "echo"),
            (json.dumps({"prompt": prompt, "logprobs": 50}).encode(), 400, "logprobs"),
            (json.dumps({"prompt": prompt, "seed": "x"}).encode(), 400, "seed"),
            (json.dumps({"prompt": prompt, "stream": "yes"}).encode(), 400, "stream"),
            (json.dumps({"max_tokens": 3}).encode(), 400, "prompt"),
            (json.dumps({"prompt": ""}).encode(), 400, "prompt"),
            (json.dumps({"prompt": [1, -5]}).encode(), 400, "prompt"),
            (json.dumps({"prompt": [1, 99999999]}).encode(), 400, "outside the vocabulary"),
            (json.dumps({"prompt": ["a", "b"]}).encode(), 400, "batched"),
            (json.dumps({"prompt": prompt, "logit_bias": {"abc": 1}}).encode(), 400, "logit_bias"),
            (json.dumps({"prompt": prompt, "model": "nope"}).encode(), 404, "not served"),
        ]
        chat_bad = [
            (json.dumps({"messages": []}).encode(), 400, "messages"),
            (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
            (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
            (json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "content"),
            (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "content"),
            (json.dumps({"messages": [{"role": "user", "content": "a"},
                                      {"role": "user", "content": "b"}]}).encode(), 400,
             "alternate"),
            (json.dumps({"messages": messages, "top_logprobs": 2}).encode(), 400, "top_logprobs"),
            (json.dumps({"messages": messages, "tools": [{"type": "function"}]}).encode(), 400,
             "tools"),
        ]
        for path, cases in (("/v1/completions", bad), ("/v1/chat/completions", chat_bad)):
            for raw, want_status, want_text in cases:
                status, headers, data = post(port, path, None, raw=raw)
                check(status == want_status, f"{raw[:60]!r}: status {status} (want {want_status}): {data!r}")
                err = json.loads(data)["error"]
                check(want_text in err["message"] and err["type"], f"{raw[:60]!r}: {err}")
        status, _, data = post(port, "/v1/completions", None,
                               raw=json.dumps({"prompt": "x" * (5 << 20)}).encode())
        check(status == 413 and "too large" in json.loads(data)["error"]["message"], f"{status} {data[:200]!r}")
        status, _, data = post(port, "/v1/nothing", {})
        check(status == 404 and json.loads(data)["error"]["message"], f"{status} {data!r}")
        print(f"ok: {len(bad) + len(chat_bad) + 2} malformed requests refused with a message")

        # A client that disconnects mid-stream cancels its request.
        before = serve_stats(stubs, channel).generated_tokens
        sock = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"prompt": prompt, "max_tokens": 500, "ignore_eos": True,
                           "temperature": 0, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while got.count(b"data: ") < 3:
            chunk = sock.recv(65536)
            check(chunk, f"stream ended early: {got!r}")
            got += chunk
        stats = serve_stats(stubs, channel)
        check(stats.running == 1, f"one request running before the disconnect: {stats}")
        sock.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            stats = serve_stats(stubs, channel)
            if stats.running == 0 and stats.kv_blocks_used == 0:
                break
            time.sleep(0.1)
        check(stats.running == 0 and stats.kv_blocks_used == 0, f"cancelled on disconnect: {stats}")
        produced = stats.generated_tokens - before
        check(produced < 450, f"stopped early: {produced} of 500 tokens")
        print(f"ok: disconnect cancelled the request after {produced} of 500 tokens")

        # Still serving.
        code, body = curl_json(port, "/v1/completions",
                               {"prompt": prompt, "max_tokens": 24, "temperature": 0})
        check(code == 200 and body["choices"][0]["text"] == ref["text"], "still serving")
    print("PASS")


if __name__ == "__main__":
    main()
