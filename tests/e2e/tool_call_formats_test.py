#!/usr/bin/python3
"""Tool calling in each model family's format, end to end through the official openai SDK
(structured_output/tool_calls.mjs: two tools, tool_choice auto / required / named, streaming and
not, arguments validated by Ajv, a follow-up turn with the returned call and its result). The
server runs with the chat template of Llama 3.1, Qwen2.5, Qwen3 and Mistral v0.3
(tests/data/chat_templates): the HTTP layer constrains `required` calls to the family's own
format (one {"name", "parameters"} object; <tool_call> blocks; a JSON array with 9-character
ids), parses them back into tool_calls, and renders the follow-up turn through the template.
With Qwen3's template, chat_template_kwargs (enable_thinking) reach the template."""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import shutil

from tandem_testlib import HttpServer, ROOT, check

CLIENTS = os.path.join(ROOT, "tests", "e2e", "structured_output")


def templates():
    with open(os.path.join(ROOT, "tests/data/chat_templates/tool_templates.json"),
              encoding="utf-8") as f:
        out = {k: v for k, v in json.load(f).items() if k in ("llama-3.1", "qwen2.5", "mistral-v0.3")}
    with open(os.path.join(ROOT, "tests/data/tokenizers/qwen3/tokenizer_config.json"),
              encoding="utf-8") as f:
        out["qwen3"] = json.load(f)["chat_template"]
    return out


def post(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def check_template_kwargs(port):
    """chat_template_kwargs reach the template: Qwen3's enable_thinking false closes an empty
    think block in the prompt (more prompt tokens); a non-object is a 400."""
    prompt_tokens = {}
    for thinking in (None, True, False):
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        status, data = post(port, body)
        check(status == 200, f"chat_template_kwargs {thinking}: {status} {data}")
        prompt_tokens[thinking] = data["usage"]["prompt_tokens"]
    check(prompt_tokens[False] > prompt_tokens[True] == prompt_tokens[None],
          f"enable_thinking does not reach the template: {prompt_tokens}")
    status, data = post(port, {"messages": [{"role": "user", "content": "Hi"}],
                               "chat_template_kwargs": ["enable_thinking"]})
    check(status == 400 and "chat_template_kwargs" in data["error"]["message"], f"{status} {data}")
    print(f"ok qwen3 chat_template_kwargs: prompt tokens {prompt_tokens}; a list is a 400")


def main(build_dir):
    subprocess.run([os.path.join(CLIENTS, "install.sh")], check=True)
    tmp = tempfile.mkdtemp(prefix="tandem-templates-")
    # The families' templates render long tool prompts: a random model of the `tiny` preset
    # (2048-token context, Llama 2 tokenizer) instead of the bundled 512-token one.
    model = os.path.join(tmp, "model")
    subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", "tiny",
                    "--out", model], check=True, capture_output=True)
    for family, source in templates().items():
        path = os.path.join(tmp, f"{family}.jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        # Qwen3's template lets the model open a <think> block, after which a constraint would
        # start (vLLM's default): a random model rarely closes it, so here the constraint
        # covers the whole output (http_chat_templates_test.py checks the default).
        extra = ["--structured-outputs-enable-in-reasoning"] if family == "qwen3" else []
        with HttpServer(build_dir, "--chat-template", path, *extra, model=model) as server:
            r = subprocess.run(["node", os.path.join(CLIENTS, "tool_calls.mjs"),
                                f"http://127.0.0.1:{server.http_port}/v1", "quick"],
                               capture_output=True, text=True, timeout=300)
            check(r.returncode == 0, f"{family}: tool_calls.mjs failed:\n{r.stdout}\n{r.stderr}")
            lines = r.stdout.splitlines()
            print(f"ok {family}: {len(lines)} checks, e.g. {lines[0][:100]}")
            if family == "qwen3":
                check_template_kwargs(server.http_port)
    shutil.rmtree(tmp, True)
    print("tool_call_formats_test: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
