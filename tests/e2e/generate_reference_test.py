#!/usr/bin/python3
"""`tandem generate` on the bundled models reproduces their greedy reference continuations.

Usage: generate_reference_test.py BUILD_DIR
Each model's README (and reference/once_upon_a_time.json) gives the exact 64 greedy token ids
and text of "Once upon a time", produced by an independent numpy implementation and llama2.c.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(build_dir, model, extra):
    ref = json.load(open(os.path.join(ROOT, "models", model, "reference", "once_upon_a_time.json")))
    cmd = [os.path.join(build_dir, "bin", "tandem"), "generate",
           "--model", os.path.join(ROOT, "models", model), "--prompt", ref["prompt"],
           "--max-tokens", str(len(ref["generated_ids"])), "--temperature", "0",
           "--print-ids", "--quiet"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, timeout=300).stdout.decode("utf-8")
    text, ids_line = out.rsplit("ids: ", 1)
    ids = [int(x) for x in ids_line.strip().split(",")]
    assert ids == ref["generated_ids"], f"{model} {extra}: ids differ:\n{ids}\n{ref['generated_ids']}"
    # generate prints the continuation followed by one newline.
    assert text[:-1] == ref["generated_text"], f"{model}: text differs:\n{text!r}\n{ref['generated_text']!r}"
    print(f"ok: {model} {' '.join(extra)}: {len(ids)} tokens and text identical to the reference")


def main():
    build_dir = sys.argv[1]
    for model in ("stories260k", "llama2xs-280k"):
        check(build_dir, model, [])
        check(build_dir, model, ["--threads", "1"])
    # The AVX2 path gives the same greedy continuation.
    os.environ["TANDEM_SIMD"] = "avx2"
    check(build_dir, "stories260k", [])


if __name__ == "__main__":
    main()
