#!/usr/bin/python3
"""The C++ engine against the independent PyTorch reference (torch_models.py), per architecture.

Usage: reference_test.py BUILD_DIR [PRESET ...]
For each preset, `tandem make-model` writes a random f32 model (norm weights not 1, so a dropped
norm weight shows); tests/reference/engine_logits (the C++ engine) and the reference compute the
logits of one 64-token sequence, which must agree within 1e-4 relative (per position: the largest
difference over the largest reference logit), and the greedy continuation of its first 16 tokens,
which must be equal.
"""
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402

PRESETS = ["tiny", "qwen3-tiny", "phi3-tiny", "phi4-tiny", "gemma3-tiny", "gemma2-tiny",
           "mixtral-tiny", "qwen3-moe-tiny", "qwen2moe-tiny"]
# Presets whose features need larger weights to show within the tolerance (Gemma 2's attention
# soft-capping bites only on scores of a few units).
INIT_STD = {"gemma2-tiny": "0.08"}
SEQ_LEN = 64
PROMPT_LEN = 16
NEW_TOKENS = 24
TOLERANCE = 1e-4


def check(build_dir, preset, work):
    model_dir = os.path.join(work, preset)
    subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", preset,
                    "--dtype", "f32", "--seed", "7", "--norm-std", "0.2",
                    "--init-std", INIT_STD.get(preset, "0.02"), "--out", model_dir],
                   check=True, capture_output=True, timeout=300)
    model = torch_models.load(model_dir)
    vocab = model.cfg["vocab_size"]
    rng = random.Random(preset)
    ids = [rng.randrange(vocab) for _ in range(SEQ_LEN)]
    out = os.path.join(work, preset + ".logits")
    tool = os.path.join(build_dir, "bin", "engine_logits")
    got = subprocess.run([tool, model_dir, ",".join(map(str, ids)), "0", out], check=True,
                         capture_output=True, timeout=300, text=True)
    engine = np.fromfile(out, dtype="<f4").astype(np.float64).reshape(SEQ_LEN, vocab)
    with torch.no_grad():
        want = model.logits(ids).numpy()
    err = np.abs(engine - want).max(axis=1) / np.abs(want).max(axis=1)
    worst = int(err.argmax())
    assert err[worst] <= TOLERANCE, (
        f"{preset}: logits at position {worst} differ by {err[worst]:.3g} relative (> {TOLERANCE})")
    assert (engine.argmax(axis=1) == want.argmax(axis=1)).all(), f"{preset}: argmax differs"

    prompt = ids[:PROMPT_LEN]
    got = subprocess.run([tool, model_dir, ",".join(map(str, prompt)), str(NEW_TOKENS), out],
                         check=True, capture_output=True, timeout=300, text=True).stdout
    engine_greedy = [int(x) for x in got.split("greedy: ", 1)[1].strip().split(",")]
    with torch.no_grad():
        want_greedy = torch_models.greedy(model, prompt, NEW_TOKENS)
    assert engine_greedy == want_greedy, (
        f"{preset}: greedy continuation differs:\n{engine_greedy}\n{want_greedy}")
    print(f"ok: {model.cfg['architectures'][0]} ({preset}): logits of {SEQ_LEN} tokens within "
          f"{err.max():.2g} relative, {NEW_TOKENS} greedy tokens equal")


def main():
    torch.set_num_threads(2)
    build_dir = sys.argv[1]
    presets = sys.argv[2:] or PRESETS
    with tempfile.TemporaryDirectory(prefix="tandem_reference_") as work:
        for preset in presets:
            check(build_dir, preset, work)


if __name__ == "__main__":
    main()
