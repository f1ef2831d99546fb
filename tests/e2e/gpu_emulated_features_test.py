#!/usr/bin/python3
"""`tandem serve --device cuda` of the test-only emulation build (scripts/build_emulated.sh) in
both activation modes of the CUDA backend, with ngram speculation and a JSON-schema constraint,
against the CPU build with the matching matmul inputs, on both bundled models in bf16:
- the parity mode (--matmul-input-dtype f32) against the CPU's f32 inputs and the default bf16
  activations (auto) against the CPU's bf16 inputs: the greedy texts of concurrent prompts and of
  a JSON-schema request are equal bit for bit (speculation on the GPU side only, so it changes
  nothing either);
- the constrained output is JSON that follows the schema;
- the speculative servers verified drafts (tandem_spec_verifications_total > 0) and their CUDA
  backend ran the mode asked for (its startup line).

Usage: gpu_emulated_features_test.py BUILD_DIR   (the emulation binary: TANDEM_EMULATED_BUILD,
or BUILD_DIR/../build-emu)."""
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tandem_testlib import ROOT, Server, check  # noqa: E402

MODELS = ("stories260k", "llama2xs-280k")
PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "Tom and Sue went to the",
           "One day, a big bird"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
TOKENS = 32


def log(message):
    print(message, flush=True)


class HttpServer(Server):
    """`tandem serve` with its OpenAI HTTP API and /metrics on free ports."""

    def __init__(self, build_dir, *args, model=None):
        d = tempfile.mkdtemp(prefix="tandem-http-")
        self.http_file = os.path.join(d, "http")
        self.metrics_file = os.path.join(d, "metrics")
        super().__init__(build_dir, "--http-port", "0", "--http-port-file", self.http_file,
                         "--metrics-port", "-1", "--metrics-port-file", self.metrics_file,
                         "--dtype", "bf16", "--kv-cache-memory", "64MiB", *args, model=model,
                         startup_timeout=120)
        deadline = time.time() + 30
        while not (os.path.exists(self.http_file) and os.path.exists(self.metrics_file)):
            check(time.time() < deadline, f"no HTTP or metrics port:\n{self.logs()}")
            time.sleep(0.05)
        self.http = int(open(self.http_file).read())
        self.metrics = int(open(self.metrics_file).read())

    def complete(self, model, prompt, **extra):
        body = {"model": model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0}
        body.update(extra)
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["text"]

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics",
                                      timeout=10).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text,
                                                          re.M))


def texts(server, model):
    """The greedy texts of PROMPTS (all at once) and of one JSON-schema request."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        out = list(pool.map(lambda p: server.complete(model, p), PROMPTS))
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    out.append(server.complete(model, "Once upon a time", response_format=fmt, max_tokens=120))
    return out


def check_schema(text):
    value = json.loads(text)
    check(set(value) == {"name", "age"} and isinstance(value["name"], str) and
          len(value["name"]) <= 12 and isinstance(value["age"], int),
          f"the constrained output follows the schema: {text!r}")


def main():
    build_dir = os.path.abspath(sys.argv[1])
    emu_dir = os.environ.get("TANDEM_EMULATED_BUILD", os.path.join(build_dir, "..", "build-emu"))
    check(os.path.exists(os.path.join(emu_dir, "bin", "tandem")),
          f"no emulation build at {emu_dir}: run scripts/build_emulated.sh")
    for name in MODELS:
        model = os.path.join(ROOT, "models", name)
        for inputs, mode in (("f32", "f32 activations (parity mode)"), ("auto", "bf16 activations")):
            cpu_inputs = "f32" if inputs == "f32" else "bf16"
            with HttpServer(build_dir, "--matmul-input-dtype", cpu_inputs, model=model) as cpu:
                want = texts(cpu, name)
            with HttpServer(emu_dir, "--device", "cuda", "--matmul-input-dtype", inputs,
                            "--speculative-method", "ngram", model=model) as gpu:
                got = texts(gpu, name)
                verifications = gpu.metric("tandem_spec_verifications_total")
                logs = gpu.logs()
            check("CUDA backend on Tandem CUDA emulator" in logs and mode in logs,
                  f"{name}: the emulated CUDA backend runs {mode}:\n{logs[-2000:]}")
            check(verifications > 0, f"{name}: speculation verified drafts ({verifications})")
            for i, (a, b) in enumerate(zip(got, want)):
                check(a == b, f"{name} {mode}, request {i}: cuda {a!r} != cpu {b!r}")
            check_schema(got[-1])
            log(f"ok: {name}, {mode} + ngram speculation ({verifications:.0f} verifications): "
                f"{len(got)} greedy texts equal the CPU build's ({cpu_inputs} inputs), JSON "
                f"{got[-1]}")
    print("PASS")


if __name__ == "__main__":
    main()
