#!/usr/bin/python3
"""LoRA adapters in the C++ engine against the independent PyTorch reference, per architecture.

Usage: lora_reference_test.py BUILD_DIR [PRESET ...]
For each preset, `tandem make-model` writes a random f32 model and this script a random PEFT
adapter (adapter_config.json + adapter_model.safetensors written with numpy by peft_np.py, not by
the C++ writer): rank 8, A and B both random, rsLoRA on some presets. The reference is torch_models.py's
float64 forward with the adapter merged into the weights (W + scale * B @ A, scale = alpha / r or
alpha / sqrt(r)); tests/reference/lora_logits (the C++ engine, the adapter applied unmerged as
grouped low-rank products) must agree within 1e-4 relative (per position: largest difference
over largest reference logit) with f32 weights, and give equal greedy continuations, alone and in
a batch with a base-model request and a request under the same adapter loaded by another name. For bf16 / int8 / int4 base weights the
adapter (bf16 there, as served by default) must stay within the format's own error: at most 2x
(+1e-4) the error the same format makes on the base model without the adapter.
Mixture-of-experts presets take attention adapters (q/k/v/o: the engine refuses MLP adapters
on experts); Phi-3 takes its fused qkv_proj and gate_up_proj.
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
from peft_np import write_adapter  # noqa: E402

# (preset, rsLoRA)
PRESETS = [("tiny", False), ("qwen3-tiny", True), ("phi3-tiny", False), ("gemma3-tiny", True),
           ("gemma2-tiny", False), ("mixtral-tiny", False), ("qwen2moe-tiny", True)]
FORMATS = ["bf16", "int8", "int4"]  # checked on the first preset
SEQ_LEN = 40
PROMPT_LEN = 12
NEW_TOKENS = 16
TOLERANCE = 1e-4
RANK = 8
ALPHA = 16.0
AMPLITUDE = 0.05  # A and B uniform in [-a, a]: moves the logits by 0.1 to 1 relative
FORMAT_SLACK = 2.0  # the adapter's logits within this many times the format's own error


def merge(model, adapter, rslora):
    scale = ALPHA / (RANK ** 0.5 if rslora else RANK)
    for name, (a, b) in adapter.items():
        model.w[name] = model.w[name] + scale * torch.from_numpy(b @ a)


def rel_error(got, want):
    return (np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max()


def engine(build_dir, model_dir, adapter_dir, ids, new_tokens, fmt, work):
    out = os.path.join(work, "logits")
    got = subprocess.run([os.path.join(build_dir, "bin", "lora_logits"), model_dir, adapter_dir,
                          ",".join(map(str, ids)), str(new_tokens), out, fmt],
                         check=True, capture_output=True, timeout=300, text=True).stdout
    lines = dict(line.split(": ", 1) for line in got.strip().splitlines())
    parse = lambda key: [int(x) for x in lines[key].split(",")] if key in lines else None  # noqa
    return np.fromfile(out, dtype="<f4").astype(np.float64), parse("greedy"), parse("mixed")


def check(build_dir, preset, rslora, formats, work):
    model_dir = os.path.join(work, preset)
    subprocess.run([os.path.join(build_dir, "bin", "tandem"), "make-model", "--preset", preset,
                    "--dtype", "f32", "--seed", "7", "--norm-std", "0.2",
                    "--init-std", "0.08" if preset == "gemma2-tiny" else "0.02",
                    "--out", model_dir], check=True, capture_output=True, timeout=300)
    base = torch_models.load(model_dir)
    cfg = base.cfg
    adapter_dir = os.path.join(work, preset + "-lora")
    adapter = write_adapter(cfg, adapter_dir, seed=len(preset), rank=RANK, alpha=ALPHA,
                            rslora=rslora, amplitude=AMPLITUDE)
    merged = torch_models.load(model_dir)
    merge(merged, adapter, rslora)
    vocab = cfg["vocab_size"]
    rng = random.Random(preset)
    ids = [rng.randrange(vocab) for _ in range(SEQ_LEN)]
    with torch.no_grad():
        want = merged.logits(ids).numpy()
        want_base = base.logits(ids).numpy()
    moved = rel_error(want, want_base)
    assert moved > 0.01, f"{preset}: the adapter barely moves the logits ({moved:.3g})"

    got, _, _ = engine(build_dir, model_dir, adapter_dir, ids, 0, "f32", work)
    err = rel_error(got.reshape(SEQ_LEN, vocab), want)
    assert err <= TOLERANCE, f"{preset}: f32 logits with the adapter differ by {err:.3g} relative"
    prompt = ids[:PROMPT_LEN]
    _, greedy, mixed = engine(build_dir, model_dir, adapter_dir, prompt, NEW_TOKENS, "f32", work)
    with torch.no_grad():
        want_greedy = torch_models.greedy(merged, prompt, NEW_TOKENS)
    assert greedy == want_greedy, f"{preset}: greedy differs:\n{greedy}\n{want_greedy}"
    assert mixed == greedy, f"{preset}: greedy in a mixed batch differs:\n{mixed}\n{greedy}"
    print(f"ok: {cfg['architectures'][0]} ({preset}{', rsLoRA' if rslora else ''}): adapter "
          f"moves logits by {moved:.2g}; engine within {err:.2g} of the merged float64 forward; "
          f"{NEW_TOKENS} greedy tokens equal, alone and in a mixed batch")
    for fmt in formats:
        got, _, _ = engine(build_dir, model_dir, adapter_dir, ids, 0, fmt, work)
        got_base, _, _ = engine(build_dir, model_dir, "-", ids, 0, fmt, work)
        err = rel_error(got.reshape(SEQ_LEN, vocab), want)
        base_err = rel_error(got_base.reshape(SEQ_LEN, vocab), want_base)
        assert err <= FORMAT_SLACK * base_err + TOLERANCE, (
            f"{preset} {fmt}: logits with the adapter differ by {err:.3g} relative, the format "
            f"alone by {base_err:.3g}")
        print(f"ok: {preset} {fmt} weights: with the adapter {err:.2g} from the merged float64 "
              f"forward, the format's own error {base_err:.2g}")


def main():
    torch.set_num_threads(2)
    build_dir = sys.argv[1]
    chosen = sys.argv[2:]
    presets = [p for p in PRESETS if not chosen or p[0] in chosen]
    with tempfile.TemporaryDirectory(prefix="tandem_lora_reference_") as work:
        for i, (preset, rslora) in enumerate(presets):
            check(build_dir, preset, rslora, FORMATS if i == 0 else [], work)


if __name__ == "__main__":
    main()
