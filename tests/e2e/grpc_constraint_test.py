#!/usr/bin/python3
"""SamplingParams.constraint over the gRPC Generation API (real generated stubs): json_schema
(strict and not), regex, grammar, json_object and choice. Outputs sampled at temperature 1 with
several seeds are checked independently: JSON Schema outputs with Ajv (node,
structured_output/validate.mjs), regex and grammar outputs with Python's `re`. Malformed schemas,
regexes and grammars are INVALID_ARGUMENT naming the location, and the server keeps serving."""
import json
import os
import re
import subprocess
import sys

import grpc

from tandem_testlib import Server, check, generate, load_stubs

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "structured_output")
SEEDS = (1, 2, 3)


def corpus(*names):
    out = {}
    with open(os.path.join(CLIENTS, "schemas.jsonl"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e["name"] in names:
                out[e["name"]] = e["schema"]
    check(len(out) == len(names), f"schemas.jsonl lacks some of {names}")
    return out


def run(stubs, stub, constraint, seed, max_tokens=160, prompt="Once upon a time"):
    """(text, finish_reason) of one sampled completion under `constraint`."""
    out = generate(stubs, stub, text=prompt, sampling=dict(
        temperature=1.0, seed=seed, max_tokens=max_tokens,
        constraint=stubs.sampling.OutputConstraint(**constraint)))
    return out[0]["text"], out[0]["final"].finish_reason


def refused(stubs, stub, constraint):
    """The INVALID_ARGUMENT details a constraint gets (fails when it is accepted)."""
    try:
        generate(stubs, stub, text="x", sampling=dict(
            max_tokens=4, constraint=stubs.sampling.OutputConstraint(**constraint)))
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{constraint}: {e.code()} {e.details()}")
        return e.details()
    raise AssertionError(f"accepted: {str(constraint)[:200]}")


def main(build_dir):
    subprocess.run([os.path.join(CLIENTS, "install.sh")], check=True)
    stubs = load_stubs()
    stop = stubs.common.FINISH_REASON_STOP
    schemas = corpus("tool/get_weather", "api/order", "ref/tree", "union/shape",
                     "number/int_crossing_zero", "allof/base_and_extension", "array/tuple_rgb",
                     "config/server")
    with Server(build_dir) as server:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(server.address))

        # 1. json_schema, strict (the default) and explicit: Ajv validates every finished output.
        cases, lengths, total = [], 0, 0
        for name, schema in schemas.items():
            for seed in SEEDS:
                c = {"json_schema": json.dumps(schema)}
                if seed == 2:
                    c["strict"] = True
                text, reason = run(stubs, stub, c, seed)
                total += 1
                if reason != stop:
                    lengths += 1
                    continue
                cases.append({"schema": schema, "text": text, "name": name})
        # strict = false: the unsupported keyword (not) is ignored, the rest still holds.
        loose = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                        "maximum": 9, "not": {"const": 3}}},
                 "required": ["n"]}
        for seed in SEEDS:
            text, reason = run(stubs, stub, {"json_schema": json.dumps(loose), "strict": False}, seed)
            total += 1
            if reason == stop:
                cases.append({"schema": {**loose, "properties": {"n": {"type": "integer",
                                                                       "minimum": 0,
                                                                       "maximum": 9}}},
                              "text": text, "name": "loose"})
            else:
                lengths += 1
        check(lengths <= total // 4, f"{lengths} of {total} json_schema outputs ran to max_tokens")
        r = subprocess.run(["node", os.path.join(CLIENTS, "validate.mjs")], input=json.dumps(cases),
                           capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"validate.mjs: {r.stderr}")
        bad = [(c["name"], c["text"], v["error"]) for c, v in zip(cases, json.loads(r.stdout))
               if not v["ok"]]
        check(not bad, f"outputs fail Ajv: {bad[:3]}")
        print(f"ok: {len(cases)} json_schema outputs ({len(schemas)} schemas, strict and not) "
              f"validate with Ajv ({lengths} ran to max_tokens)")

        # 2. regex, grammar, json_object, choice: checked with Python.
        phone = r"\(\d{3}\) \d{3}-\d{4}"
        grammar = 'root ::= "The " ("cat" | "dog") " is " [a-z]{1,8} "."'
        for seed in SEEDS:
            text, reason = run(stubs, stub, {"regex": phone}, seed)
            check(reason == stop and re.fullmatch(phone, text), f"regex: {text!r} {reason}")
            text, reason = run(stubs, stub, {"grammar": grammar}, seed)
            check(reason == stop and re.fullmatch(r"The (cat|dog) is [a-z]{1,8}\.", text),
                  f"grammar: {text!r}")
            text, reason = run(stubs, stub, {"regex": r"[a-f0-9]{8}-(yes|no)"}, seed)
            check(reason == stop and re.fullmatch(r"[a-f0-9]{8}-(yes|no)", text), f"regex: {text!r}")
            text, reason = run(stubs, stub, {"choice": stubs.sampling.ChoiceList(
                choices=["north", "south", "east by east"])}, seed)
            check(text in ("north", "south", "east by east"), f"choice: {text!r}")
            text, reason = run(stubs, stub, {"json_object": True}, seed, max_tokens=200)
            if reason == stop:
                check(isinstance(json.loads(text), dict), f"json_object: {text!r}")
        print("ok: regex, grammar, choice and json_object outputs hold")

        # 3. Bad constraints: INVALID_ARGUMENT naming the location; the server keeps serving.
        deep = {"type": "string"}
        for _ in range(100):
            deep = {"type": "array", "items": deep}
        bad = [
            ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"not": {}}}})},
             ["#/properties/a", "not"]),
            ({"json_schema": json.dumps({"properties": {"b": {"$ref": "#/$defs/missing"}}})},
             ["#/properties/b", "#/$defs/missing"]),
            ({"json_schema": json.dumps({"type": "integer", "minimum": 5, "maximum": 1})},
             ["#", "bounds"]),
            ({"json_schema": "{\"type\": "}, ["not valid JSON"]),
            ({"json_schema": json.dumps({"type": "object", "properties": {"x": {"type": "tuple"}}})},
             ["#/properties/x", "tuple"]),
            ({"json_schema": json.dumps({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}},
                                         "$ref": "#/$defs/a"})}, ["nested too deeply"]),
            ({"json_schema": json.dumps(deep)}, ["nested too deeply"]),
            ({"json_schema": json.dumps({"enum": list(range(20000))})}, ["enum"]),
            ({"json_schema": json.dumps({"type": "string", "pattern": "(?=x)"})},
             ["#/pattern"]),
            ({"regex": "(unclosed"}, ["regex"]),
            ({"regex": "a\\1"}, ["regex"]),
            ({"grammar": "root ::= [a-"}, ["line 1"]),
            ({"grammar": 'root ::= "a"\nroot ::= "b"'}, ["root"]),
            ({"grammar": 'start ::= "a"'}, ["root"]),
            ({"grammar": "root ::= x"}, ["x"]),
            ({"grammar": "root ::= [a-z]{1001}"}, ["1000"]),
            ({"grammar": "root ::= " + "(" * 300 + '"a"' + ")" * 300}, ["deep"]),
        ]
        for constraint, needles in bad:
            details = refused(stubs, stub, constraint)
            for needle in needles:
                check(needle in details, f"{str(constraint)[:80]}: {needle!r} not in {details!r}")
            text, reason = run(stubs, stub, {"regex": "ok[0-9]"}, 1, max_tokens=8)
            check(re.fullmatch("ok[0-9]", text), f"still serving after {str(constraint)[:60]}")
        print(f"ok: {len(bad)} malformed constraints refused naming the location; still serving")
    print("grpc_constraint_test: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
