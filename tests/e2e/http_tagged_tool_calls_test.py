#!/usr/bin/python3
"""The tagged tool-call formats end to end (qwen3_coder, glm45, minimax_m2, kimi_k2): a server
with --tool-call-parser FAMILY, a chat completion with tools whose output is forced (guided_regex)
to be a call written the way that family writes it; message.tool_calls must carry the call with
its parameters typed by the tool's schema (an integer stays an integer, a string stays a string),
finish_reason "tool_calls", and the streamed deltas must add up to the same call."""
import http.client
import json
import re
import sys

from tandem_testlib import HttpServer, check

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "zip": {"type": "string"}}}}}]
WANT = {"city": "Paris", "days": 3, "zip": "75001"}

CALLS = {
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n"
                   "</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n"
             "<arg_value>75001</arg_value>\n</tool_call>",
    "minimax_m2": "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">"
                  "Paris</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter "
                  "name=\"zip\">75001</parameter>\n</invoke>\n</minimax:tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3, \"zip\": \"75001\"}"
               "<|tool_call_end|><|tool_calls_section_end|>",
}


def request(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    return r.status, data


def streamed_calls(data):
    """The tool calls the SSE deltas of a streamed response add up to."""
    calls, finish = {}, None
    for line in data.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        finish = choice.get("finish_reason") or finish
        for d in choice.get("delta", {}).get("tool_calls", []):
            c = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
            c["id"] += d.get("id", "")
            c["name"] += d.get("function", {}).get("name", "")
            c["arguments"] += d.get("function", {}).get("arguments", "")
    return [calls[i] for i in sorted(calls)], finish


def main(build_dir):
    for family, text in CALLS.items():
        with HttpServer(build_dir, "--tool-call-parser", family) as server:
            body = {"messages": [{"role": "user", "content": "The weather in Paris?"}],
                    "tools": TOOLS, "max_tokens": 300, "guided_regex": re.escape(text)}
            status, data = request(server.http_port, body)
            check(status == 200, f"{family}: {status} {data}")
            choice = json.loads(data)["choices"][0]
            check(choice["finish_reason"] == "tool_calls", f"{family}: {choice}")
            calls = choice["message"]["tool_calls"]
            check(len(calls) == 1 and calls[0]["function"]["name"] == "get_weather",
                  f"{family}: {choice}")
            check(json.loads(calls[0]["function"]["arguments"]) == WANT, f"{family}: {calls}")
            check(choice["message"]["content"] is None, f"{family}: {choice}")
            if family == "kimi_k2":
                check(calls[0]["id"] == "functions.get_weather:0", f"{family}: {calls}")
            status, data = request(server.http_port, dict(body, stream=True))
            check(status == 200, f"{family} streamed: {status} {data}")
            streamed, finish = streamed_calls(data)
            check(finish == "tool_calls" and len(streamed) == 1, f"{family} streamed: {data}")
            check(streamed[0]["name"] == "get_weather" and
                  json.loads(streamed[0]["arguments"]) == WANT, f"{family} streamed: {streamed}")
            if family == "kimi_k2":  # the model's own id, the same streamed or not
                check(streamed[0]["id"] == calls[0]["id"], f"{family} streamed: {streamed}")
            print(f"ok {family}: {calls[0]['function']['arguments']}")
    print("http_tagged_tool_calls_test: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
