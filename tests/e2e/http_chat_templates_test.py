#!/usr/bin/python3
"""Real upstream chat templates (tests/data/chat_templates/upstream, llama.cpp's copies of the
Hub's) through `tandem serve`'s HTTP API:

- the prompt of each OpenAI request (tools, calls and results, parallel calls,
  continue_final_message, add_generation_prompt false, chat_template_kwargs) equals the one
  @huggingface/jinja renders from the same template (structured_output/template_prompts.mjs:
  Tandem's prompt_token_ids against the reference text's ids from POST /tokenize);
- each family's call format, forced as the model's output, reaches the official openai SDK as
  the same tool_calls streamed and not, in a two-tool agent loop (call, result, answer;
  structured_output/agent_loop.mjs), with the reasoning of a thinking template in
  reasoning_content;
- with a template that opens the reasoning block, an output constraint applies to the answer
  only: the model reasons freely first.

The server is a random model of the `tiny` preset (2048-token context, Llama 2 tokenizer): the
prompts are long, and what is checked is Tandem's text handling, not the model."""
import http.client
import json
import os
import subprocess
import sys
import tempfile

from tandem_testlib import HttpServer, ROOT, check

CLIENTS = os.path.join(ROOT, "tests", "e2e", "structured_output")
TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates", "upstream")

# template_prompts.mjs's mode: templates written for tool use only; templates that add a call's
# arguments to a string (refused with dict arguments, as Python's Jinja refuses them).
MODES = {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "always-tools",
         "deepseek-ai-DeepSeek-V3.1": "string-arguments"}
# template file -> the agent loop's call format (None: prompts only), extra server flags.
FAMILIES = [
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3_json", []),
    ("meta-llama-Llama-3.2-3B-Instruct", "pythonic", []),
    ("Qwen-Qwen2.5-7B-Instruct", "hermes", []),
    ("Qwen-Qwen3-0.6B", "hermes_thinking", ["--structured-outputs-enable-in-reasoning"]),
    ("Qwen-QwQ-32B", None, []),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", []),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", None, []),
    ("deepseek-ai-DeepSeek-V3.1", None, []),
    ("microsoft-Phi-3.5-mini-instruct", None, []),
    ("google-gemma-2-2b-it", None, []),
    # Formats whose templates are not bundled: the parser chosen by flag, over Qwen2.5's.
    ("Qwen-Qwen2.5-7B-Instruct", "phi4_mini_json", ["--tool-call-parser", "phi4_mini_json"]),
    ("Qwen-Qwen2.5-7B-Instruct", "deepseek_v3", ["--tool-call-parser", "deepseek_v3"]),
]


def post(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def node(script, *args):
    r = subprocess.run(["node", os.path.join(CLIENTS, script), *args], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"{script} {args[1:]} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout.splitlines()


def check_answer_only(port):
    """The R1-distill template opens <think> in the prompt: a forced choice applies after the
    reasoning block, so the random model's first tokens are free reasoning, not the choice."""
    status, data = post(port, {"messages": [{"role": "user", "content": "Yes or no?"}],
                               "guided_choice": ["yes"], "max_tokens": 12, "temperature": 0})
    check(status == 200, f"{status} {data}")
    m = data["choices"][0]["message"]
    check(m.get("reasoning_content") and m.get("content") in (None, "") and
          data["choices"][0]["finish_reason"] == "length",
          f"the constraint must wait for the end of the reasoning: {m}")
    print(f"ok answer-only constraint: {data['usage']['completion_tokens']} tokens of reasoning "
          f"({m['reasoning_content'][:30]!r}...), no answer yet")


def main(build_dir):
    subprocess.run([os.path.join(CLIENTS, "install.sh")], check=True)
    tmp = tempfile.mkdtemp(prefix="tandem-upstream-")
    model = os.path.join(tmp, "model")
    subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", "tiny",
                    "--out", model], check=True, capture_output=True)
    seen = set()
    for name, loop, flags in FAMILIES:
        path = os.path.join(TEMPLATES, name + ".jinja")
        with HttpServer(build_dir, "--chat-template", path, *flags, model=model) as server:
            base = f"http://127.0.0.1:{server.http_port}/v1"
            if name not in seen:
                seen.add(name)
                lines = node("template_prompts.mjs", base, path, "<s>", "</s>",
                             MODES.get(name, ""))
                print(f"ok {name}: {len(lines)} prompt cases as @huggingface/jinja renders them")
            if loop is not None:
                lines = node("agent_loop.mjs", base, loop)
                print(f"ok {name} / {loop}: {lines[-1]}")
            if name == "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B":
                check_answer_only(server.http_port)
    print("http_chat_templates_test: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
