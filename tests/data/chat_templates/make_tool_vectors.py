#!/usr/bin/python3
"""Writes tool_vectors.json: tool-calling conversations (the `tools` list, assistant
`tool_calls`, `tool` results, parallel calls) rendered by each family's chat template with
Python's jinja2 configured as Hugging Face transformers' apply_chat_template configures it (the
environment of make_vectors.py). Templates: tool_templates.json (Llama 3.1, Llama 3.2, Qwen2.5,
Mistral v0.3) and the bundled Qwen3 tokenizer's. Messages have the shape Tandem's HTTP layer
hands the template (router/http/openai_request.cc): content a string, tool_calls with
`function.arguments` as an object. Run at test-preparation time only:
  /usr/bin/python3 tests/data/chat_templates/make_tool_vectors.py
"""
import importlib.util
import json
import os

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("make_vectors", os.path.join(HERE, "make_vectors.py"))
make_vectors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_vectors)

with open(os.path.join(HERE, "tool_templates.json"), encoding="utf-8") as f:
    TEMPLATES = {name: source for name, source in json.load(f).items() if not name.startswith("_")}
TEMPLATES["qwen3"] = make_vectors.from_config("qwen3")

SPECIAL = {  # bos_token, eos_token
    "llama-3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "mistral-v0.3": ("<s>", "</s>"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                       "required": ["tz"]}}},
]


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CALL1 = call("call00001", "get_weather", {"city": "Paris", "unit": "celsius"})
CALL2 = call("call00002", "get_time", {"tz": "Europe/Paris"})
RESULT1 = {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}", "tool_call_id": "call00001",
           "name": "get_weather"}
RESULT2 = {"role": "tool", "content": "14:05", "tool_call_id": "call00002", "name": "get_time"}

CONVERSATIONS = {
    "tools_system_user": [
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "user", "content": "Weather in Paris?"}],
    "tools_user": [{"role": "user", "content": "What time is it in Paris?"}],
    "call_then_result": [
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL1]},
        RESULT1],
    "call_result_answer_followup": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL1]},
        RESULT1,
        {"role": "assistant", "content": "It is 21 C and clear in Paris."},
        {"role": "user", "content": "Thanks! And the time?"}],
    "parallel_calls": [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL1, CALL2]},
        RESULT1, RESULT2],
}


def main():
    env = make_vectors.hf_environment()
    cases = []
    for tname, source in TEMPLATES.items():
        bos, eos = SPECIAL[tname]
        for cname, messages in CONVERSATIONS.items():
            for with_tools in (True, False):
                if not with_tools and cname.startswith("tools_"):
                    continue
                variables = {"messages": messages, "add_generation_prompt": True,
                             "bos_token": bos, "eos_token": eos, "date_string": "03 Dec 2026"}
                if with_tools:
                    variables["tools"] = TOOLS
                case = {"template": tname, "name": f"{tname}/{cname}/tools={with_tools}",
                        "variables": variables}
                try:
                    case["expected"] = env.from_string(source).render(**variables)
                except Exception as e:  # noqa: BLE001 - a refusal of the reference is a vector
                    case["error"] = str(e)
                cases.append(case)
    with open(os.path.join(HERE, "tool_vectors.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": f"jinja2 {jinja2.__version__} (transformers' environment)",
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
