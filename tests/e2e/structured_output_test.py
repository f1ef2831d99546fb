#!/usr/bin/python3
"""Structured output end to end through `tandem serve` (router + disaggregated prefill and decode
workers): JSON-schema constrained completions sampled at temperature 1 with several seeds always
parse and validate with Ajv (an independent validator, tests/e2e/structured_output/validate.mjs);
regex, choice and grammar constraints hold; malformed schemas, regexes and grammars get a 400 and
the server keeps serving; tool calling through the official openai SDK
(structured_output/tool_calls.mjs)."""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from tandem_testlib import Cluster, check

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENTS = os.path.join(HERE, "structured_output")

# Hand-written schemas in the shapes tool and extraction schemas take: nested objects, arrays
# with bounds, enums, unions, $refs (recursive too), optional properties, tuples.
S = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 5}},
     "required": ["ok"]},
    {"enum": ["red", "green", "blue", 7, None, True]},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]}]},
    {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "v": {"enum": [1, 2]}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}}},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                      "qty": {"type": "integer", "exclusiveMinimum": 0}},
     "required": ["id", "qty"]},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"enum": ["x", "y"]}], "items": False},
    {"type": "object", "properties": {"user": {"$ref": "#/definitions/user"},
                                      "role": {"enum": ["admin", "guest"]}},
     "required": ["user", "role"], "definitions": {"user": {"type": "object", "properties": {
         "first": S, "last": S}, "required": ["first"]}}},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object",
        "properties": {"c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "string", "minLength": 2, "maxLength": 6},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "mood": {"enum": ["up", "down"]}}, "required": ["when", "mood"]},
    {"type": "object", "properties": {"point": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                                 "minItems": 2, "maxItems": 2}}, "required": ["point"]},
    {"type": "object", "properties": {"k": {"enum": ["v1", "v2"]}}, "required": ["k"],
     "additionalProperties": {"type": "boolean"}},
]
SEEDS = [1, 2, 3, 4]
# Debian's json-schema-test-suite (scripts/setup.sh installs it): every draft 4, 6 and 7 schema.
SUITE = "/usr/share/json-schema-test-suite/tests"


def suite_schemas():
    import glob
    seen, out = set(), []
    for draft in ("draft7", "draft6", "draft4"):
        for path in sorted(glob.glob(os.path.join(SUITE, draft, "*.json"))):
            for group in json.load(open(path)):
                key = json.dumps(group["schema"], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append((f"{draft}/{os.path.basename(path)}: {group['description']}",
                                group["schema"]))
    return out


def hand_written():
    """(name, schema, dialect) of structured_output/schemas.jsonl: API payloads, configs, tool
    arguments, forms, $defs/$ref and recursion, unions, allOf, tuples, bounds, formats."""
    out = []
    with open(os.path.join(CLIENTS, "schemas.jsonl"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            out.append((e["name"], e["schema"], e.get("dialect")))
    return out


def closing_tokens():
    """{id: logit bias} of the bundled model's tokens '"', ']' and '}' (and byte fallbacks)."""
    with open(os.path.join(ROOT, "models", "stories260k", "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    # Quotes less than brackets: the model favours quotes (its stories have dialogue), and a
    # quote also opens the next key.
    bias = {'"': 5, "<0x22>": 5, "]": 15, "<0x5D>": 15, "}": 15, "<0x7D>": 15}
    ids = {vocab[t]: b for t, b in bias.items() if t in vocab}
    check(len(ids) >= 3, f"closing tokens not found: {ids}")
    return ids


def exercise(port, corpus):
    """Samples every schema concurrently, two seeds first, then (longer) more seeds for schemas
    whose samples all ran to max_tokens: ({name: [finished outputs]}, {name: 400 message})."""
    from concurrent.futures import ThreadPoolExecutor
    outputs, refused = {}, {}

    closers = closing_tokens()

    def one(name, schema, seed):
        body = {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 1.0,
                "seed": seed, "guided_json": schema}
        if seed > 2:
            # The bundled model is tiny: under a mask it picks nearly uniformly among the allowed
            # tokens, so a string, key or array it is free to extend rarely ends. Retries use
            # nearly all of its 512-token context and favour the tokens that close strings,
            # arrays and objects (logit_bias; the mask still decides what is allowed, so the
            # check of the output is unchanged).
            body["max_tokens"] = 480
            body["logit_bias"] = {str(t): b for t, b in closers.items()}
            if seed >= 7 and seed % 2 == 0:
                # Recursive objects ({"foo": {"foo": ...}}) go deeper with every opened key:
                # every other late retry discourages quotes instead.
                body["logit_bias"].update({str(t): -5 for t, b in closers.items() if b == 5})
        status, body = post(port, "/v1/completions", body)
        return name, seed, status, body

    pending = [(name, schema, seed) for name, schema, _ in corpus for seed in (1, 2)]
    with ThreadPoolExecutor(8) as pool:
        for seed in range(3, 25):
            tried = {}
            for name, seed_used, status, body in pool.map(lambda a: one(*a), pending):
                tried[name] = max(tried.get(name, 0), seed_used)
                if status == 400:
                    refused[name] = body["error"]["message"]
                    continue
                check(status == 200, f"{name}: {status} {body}")
                ch = body["choices"][0]
                if ch["finish_reason"] == "stop":
                    outputs.setdefault(name, []).append(ch["text"])
                else:
                    check(ch["finish_reason"] == "length", f"{name}: {ch}")
            pending = [(name, schema, seed) for name, schema, _ in corpus
                       if name in tried and name not in refused and not outputs.get(name)]
            if pending:
                print(f"{len(pending)} schemas without a finished output after seed {seed - 1}"
                      + (f": {[p[0] for p in pending]}" if len(pending) <= 4 else ""))
            else:
                break
    return outputs, refused


class HttpCluster(Cluster):
    def __init__(self, build_dir, prefill, decode, *args):
        tmp = tempfile.mkdtemp(prefix="tandem-so-")
        port_file = os.path.join(tmp, "http_port")
        super().__init__(build_dir, prefill, decode, "--http-port", "0", "--http-port-file",
                         port_file, *args)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            check(time.time() < deadline and self.proc.poll() is None, f"no HTTP port:\n{self.logs()}")
            time.sleep(0.05)
        self.http_port = int(open(port_file).read())


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data)


def node(script, stdin=None, *args):
    return subprocess.run(["node", os.path.join(CLIENTS, script), *args], input=stdin,
                          capture_output=True, text=True, timeout=600)


def main(build_dir):
    subprocess.run([os.path.join(CLIENTS, "install.sh")], check=True)
    # chatml renders tool messages (the default llama-2 template insists on user/assistant turns).
    with HttpCluster(build_dir, 1, 1, "--chat-template", "chatml") as server:
        port = server.http_port
        # 1. The schema corpus: the hand-written schemas (schemas.jsonl, and SCHEMAS above) and
        # every json-schema-test-suite schema that compiles (the rest must be refused with a 400
        # naming the location). Each is sampled at temperature 1 with two seeds (more, up to
        # 23, while every sample ran to max_tokens); every finished output validates with Ajv,
        # and every compiling schema gets at least one finished output.
        corpus = [(f"inline/{i}", schema, None) for i, schema in enumerate(SCHEMAS)]
        corpus += hand_written()
        corpus += [(name, schema, "draft7") for name, schema in suite_schemas()]
        outputs, refused = exercise(port, corpus)
        compiled = [c for c in corpus if c[0] not in refused]
        unexercised = [name for name, _, _ in compiled if not outputs.get(name)]
        cases = [{"schema": schema, "text": text, "dialect": dialect, "name": name}
                 for name, schema, dialect in compiled for text in outputs.get(name, [])]
        suite_refused = [n for n in refused if n.startswith("draft")]
        check(len(refused) == len(suite_refused), f"hand-written schemas refused: "
              f"{[(n, refused[n]) for n in refused if not n.startswith('draft')][:5]}")
        for name, message in refused.items():
            check("at #" in message or "not valid JSON" in message, f"{name}: {message}")
        check(len(compiled) >= 200, f"only {len(compiled)} schemas compile")
        check(not unexercised, f"{len(unexercised)} schemas never finished within max_tokens: "
              f"{unexercised}")
        # Chat with response_format json_schema (strict) and json_object.
        for seed in SEEDS:
            status, body = post(port, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
                "max_tokens": 200, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "cat", "strict": True, "schema": SCHEMAS[0]}}})
            check(status == 200, f"response_format: {status} {body}")
            ch = body["choices"][0]
            if ch["finish_reason"] == "stop":
                cases.append({"schema": SCHEMAS[0], "text": ch["message"]["content"],
                              "name": "chat/json_schema"})
            status, body = post(port, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Any JSON object."}],
                "max_tokens": 200, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_object"}})
            check(status == 200, f"json_object: {status} {body}")
            ch = body["choices"][0]
            if ch["finish_reason"] == "stop":
                cases.append({"schema": {"type": "object"}, "text": ch["message"]["content"],
                              "name": "chat/json_object"})
        r = node("validate.mjs", json.dumps(cases))
        check(r.returncode == 0, f"validate.mjs failed: {r.stderr}")
        bad = [(c["name"], c["text"], v["error"]) for c, v in zip(cases, json.loads(r.stdout))
               if not v["ok"]]
        check(not bad, f"{len(bad)} outputs fail Ajv: {bad[:3]}")
        n_suite = len(suite_schemas())
        print(f"ok: {len(compiled)} schemas compile ({len(corpus) - n_suite} hand-written, "
              f"{n_suite - len(suite_refused)} of the suite's {n_suite}; {len(suite_refused)} "
              f"refused with a 400 naming the location); {len(cases)} sampled outputs validate "
              f"with Ajv, every schema at least once")

        # 2. Regex, choice and grammar (vLLM guided_* fields).
        for seed in SEEDS:
            status, body = post(port, "/v1/completions", {
                "prompt": "Call", "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
            check(status == 200 and re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", body["choices"][0]["text"]),
                  f"regex: {body}")
            status, body = post(port, "/v1/completions", {
                "prompt": "Pick", "max_tokens": 20, "temperature": 1.0, "seed": seed,
                "guided_choice": ["left", "right", "straight on"]})
            check(status == 200 and body["choices"][0]["text"] in ("left", "right", "straight on"),
                  f"choice: {body}")
            status, body = post(port, "/v1/completions", {
                "prompt": "Say", "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "guided_grammar": 'root ::= "The " ("cat" | "dog") " is " [a-z]{1,8} "."'})
            check(status == 200 and re.fullmatch(r"The (cat|dog) is [a-z]{1,8}\.",
                                                  body["choices"][0]["text"]), f"grammar: {body}")
        print("ok: regex, choice and grammar constraints hold")

        # 3. Bad input: a 400 naming the problem; the server keeps serving.
        bombs = [
            ("guided_json", {"type": "object", "not": {}}, "not"),
            ("guided_json", {"$ref": "#/$defs/nowhere"}, "resolve"),
            ("guided_json", json.loads("{" * 40 + "}" * 40) if False else
             {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {}}}}, None),
            ("guided_regex", "(unclosed", "regex"),
            ("guided_regex", "(?=look)ahead", "regex"),
            ("guided_grammar", "root ::= [a-", "grammar"),
            ("guided_grammar", "root ::= root", "grammar"),
            ("guided_grammar", 'root ::= "' + "x" * 300 + '"{1000}{1000}', None),
            ("guided_json", {"enum": list(range(20000))}, "enum"),
        ]
        for field, value, needle in bombs:
            status, body = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 4, field: value})
            if needle is None:
                continue  # accepted or refused, the server must just keep serving
            check(status == 400, f"{field}={str(value)[:60]}: {status} {body}")
            check(needle in body["error"]["message"], f"{field}: message {body['error']['message']}")
        status, body = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 4})
        check(status == 200, "still serving after bad constraints")
        print(f"ok: {len(bombs)} malformed constraints refused; still serving")

        # 4. Tool calling through the official openai SDK.
        r = node("tool_calls.mjs", None, f"http://127.0.0.1:{port}/v1")
        print(r.stdout)
        check(r.returncode == 0, f"tool_calls.mjs failed:\n{r.stdout}\n{r.stderr}")
    print("structured_output_test: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
