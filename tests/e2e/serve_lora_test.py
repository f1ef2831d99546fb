#!/usr/bin/python3
"""Multi-LoRA serving through `tandem serve` (HTTP and gRPC): adapters loaded at start
(--lora-modules) and at runtime (POST /v1/load_lora_adapter), selected by the `model` field,
listed by /v1/models with their base as `parent`; unknown names 404; unloading an adapter while
a request streams with it loses nothing; runtime loading is refused without API keys unless
--allow-runtime-lora-updating, and with API keys needs the admin scope; per-adapter metrics; the
same through the official openai SDK (structured_output/lora_sdk.mjs)."""
import hashlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from http_api_test import HttpServer, post, post_json  # noqa: E402
from peft_np import write_adapter  # noqa: E402
from tandem_testlib import ROOT, check, generate, load_stubs  # noqa: E402

MODEL = os.path.join(ROOT, "models", "stories260k")
PROMPT = "Once upon a time"


def get_json(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def complete(port, model, max_tokens=16, prompt=PROMPT):
    status, body = post_json(port, "/v1/completions", {"model": model, "prompt": prompt,
                                                       "max_tokens": max_tokens,
                                                       "temperature": 0, "ignore_eos": True})
    check(status == 200, f"completion with model {model}: {status} {body}")
    return body["choices"][0]["text"]


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    tmp = tempfile.mkdtemp(prefix="tandem-lora-")
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    dirs = {}
    for i, name in enumerate(["sql", "poet", "chef"]):
        dirs[name] = os.path.join(tmp, name)
        write_adapter(cfg, dirs[name], seed=i + 1, amplitude=0.15)
    big = os.path.join(tmp, "big")
    write_adapter(cfg, big, seed=9, rank=32)

    metrics_file = os.path.join(tmp, "metrics-port")
    with HttpServer(build_dir, "--model", MODEL, "--lora-modules", f"sql={dirs['sql']}",
                    "--max-loras", "2", "--max-cpu-loras", "2", "--allow-runtime-lora-updating",
                    "--metrics-port=-1", f"--metrics-port-file={metrics_file}") as server:
        port = server.http_port
        metrics_url = f"http://127.0.0.1:{int(open(metrics_file).read())}/metrics"
        status, models = get_json(port, "/v1/models")
        check(status == 200, f"/v1/models: {status}")
        by_id = {m["id"]: m for m in models["data"]}
        check(set(by_id) == {"stories260k", "sql"}, f"models listed: {sorted(by_id)}")
        check(by_id["sql"]["parent"] == "stories260k" and by_id["sql"]["root"] == dirs["sql"],
              f"adapter entry: {by_id['sql']}")
        check(by_id["stories260k"]["parent"] is None, f"base entry: {by_id['stories260k']}")
        print("ok: /v1/models lists the adapter with its base as parent")

        base = complete(port, "stories260k")
        sql = complete(port, "sql")
        check(sql != base, f"the adapter changes nothing: {sql!r}")
        check(complete(port, "sql") == sql, "the adapter's greedy output is not reproducible")
        # gRPC: the same adapter by GenerateRequest.model, the same tokens as over HTTP.
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))
        out = generate(stubs, stub, text=PROMPT, model="sql",
                       sampling={"max_tokens": 16, "temperature": 0, "ignore_eos": True})
        check(out[0]["text"] == sql, f"gRPC with the adapter: {out[0]['text']!r} vs {sql!r}")
        status, err = post_json(port, "/v1/completions",
                                {"model": "nope", "prompt": PROMPT, "max_tokens": 4})
        check(status == 404, f"unknown model: {status} {err}")
        print("ok: model=sql selects the adapter (HTTP and gRPC alike); unknown names are 404")

        status, _, body = post(port, "/v1/load_lora_adapter",
                               {"lora_name": "poet", "lora_path": dirs["poet"]})
        check(status == 200 and b"Success" in body, f"load: {status} {body!r}")
        poet = complete(port, "poet")
        check(poet not in (base, sql), "the runtime-loaded adapter is not used")
        for bad, want in [({"lora_name": "poet", "lora_path": dirs["poet"]}, "already loaded"),
                          ({"lora_name": "big", "lora_path": big}, "over --max-lora-rank 16"),
                          ({"lora_name": "x", "lora_path": tmp + "/none"}, "not a directory"),
                          ({"lora_name": "chef", "lora_path": dirs["chef"]}, "the limit"),
                          ({"lora_name": "x"}, "lora_path")]:
            status, err = post_json(port, "/v1/load_lora_adapter", bad)
            check(status in (400, 404) and want in err["error"]["message"],
                  f"load {bad}: {status} {err}")
        print("ok: runtime load; bad adapters, duplicates and the --max-cpu-loras limit refused")

        # Unload while a request streams with the adapter: the request finishes whole.
        result = {}

        def stream():
            result["status"], result["body"] = post_json(
                port, "/v1/completions", {"model": "poet", "prompt": PROMPT, "max_tokens": 200,
                                          "temperature": 0, "ignore_eos": True})
        t = threading.Thread(target=stream)
        t.start()
        for _ in range(200):  # until the request runs
            text = urllib.request.urlopen(metrics_url).read().decode()
            if 'tandem_engine_requests_running{role="both"} 1' in text:
                break
        status, _, body = post(port, "/v1/unload_lora_adapter", {"lora_name": "poet"})
        check(status == 200, f"unload: {status} {body!r}")
        t.join(120)
        check(result.get("status") == 200, f"the running request failed: {result}")
        choice = result["body"]["choices"][0]
        check(choice["finish_reason"] == "length" and
              result["body"]["usage"]["completion_tokens"] == 200, f"cut short: {choice}")
        check(choice["text"].startswith(poet), "the request changed adapter mid-way")
        status, err = post_json(port, "/v1/completions",
                                {"model": "poet", "prompt": PROMPT, "max_tokens": 4})
        check(status == 404, f"after unload: {status} {err}")
        status, err = post_json(port, "/v1/unload_lora_adapter", {"lora_name": "poet"})
        check(status == 404, f"unload twice: {status} {err}")
        print(f"ok: unloading an adapter in use ({body.decode().strip()!r}) loses nothing")

        text = urllib.request.urlopen(metrics_url).read().decode()
        for want in ['tandem_lora_sequences_finished_total{lora_adapter="sql",role="both"} 3',
                     'tandem_lora_generation_tokens_total{lora_adapter="poet",role="both"} 216',
                     'tandem_lora_adapters{role="both",state="loaded"} 1']:
            check(want in text, f"metrics lack {want!r}:\n" +
                  "\n".join(l for l in text.splitlines() if "lora" in l))
        print("ok: per-adapter metrics and the loaded-adapters gauge")

        # The official openai SDK (npm `openai`, tests/e2e/structured_output/package.json).
        clients = os.path.join(ROOT, "tests", "e2e", "structured_output")
        subprocess.run([os.path.join(clients, "install.sh")], check=True)
        r = subprocess.run(["node", os.path.join(clients, "lora_sdk.mjs"),
                            f"http://127.0.0.1:{port}/v1", "sql", dirs["chef"]],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"lora_sdk.mjs failed:\n{r.stdout}\n{r.stderr}")
        print(r.stdout.strip())

    # Without API keys and without --allow-runtime-lora-updating: no runtime loading.
    with HttpServer(build_dir, "--model", MODEL, "--enable-lora") as server:
        status, err = post_json(server.http_port, "/v1/load_lora_adapter",
                                {"lora_name": "sql", "lora_path": dirs["sql"]})
        check(status == 400 and "--allow-runtime-lora-updating" in err["error"]["message"],
              f"open access load: {status} {err}")
        print("ok: runtime loading is off by default without API keys")

    # With API keys: a generate-scoped key may not load; an admin key may.
    keys = os.path.join(tmp, "keys")
    digest = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    with open(keys, "w") as f:
        f.write(f"tenant acme\ntenant ops\nkey {digest('sk-user')} acme\n"
                f"key {digest('sk-admin')} ops scopes=admin,generate\n")
    with HttpServer(build_dir, "--model", MODEL, "--enable-lora", "--api-keys", keys) as server:
        body = {"lora_name": "chef", "lora_path": dirs["chef"]}
        status, _, err = post(server.http_port, "/v1/load_lora_adapter", body,
                              headers={"Authorization": "Bearer sk-user"})
        check(status == 403 and b"admin" in err, f"generate-scoped key loads: {status} {err!r}")
        status, _, err = post(server.http_port, "/v1/load_lora_adapter", body)
        check(status == 401, f"no key loads: {status} {err!r}")
        status, _, _ = post(server.http_port, "/v1/load_lora_adapter", body,
                            headers={"Authorization": "Bearer sk-admin"})
        check(status == 200, f"admin key load: {status}")
        status, out = post_json(server.http_port, "/v1/completions",
                                {"model": "chef", "prompt": PROMPT, "max_tokens": 4},
                                headers={"Authorization": "Bearer sk-user"})
        check(status == 200, f"tenant uses the adapter: {status} {out}")
        print("ok: with API keys, loading takes the admin scope")


if __name__ == "__main__":
    main()
