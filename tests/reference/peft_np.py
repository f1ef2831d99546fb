"""Writes random PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors) with numpy,
straight from the formats' definitions, independent of the C++ writer
(common/engine/lora/lora_writer.h). Used by the reference and end-to-end tests."""
import json
import os

import numpy as np


def modules_of(cfg):
    """(parent, module, in, out) of each projection an adapter of this config targets: the seven
    of the Llama block; Phi-3's fused qkv_proj / gate_up_proj; attention only on
    mixture-of-experts models (the engine refuses MLP adapters on experts)."""
    arch = cfg["architectures"][0]
    h = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", h)
    d = cfg.get("head_dim") or cfg["hidden_size"] // h
    hidden, ffn = cfg["hidden_size"], cfg["intermediate_size"]
    if arch == "Phi3ForCausalLM":
        return [("self_attn", "qkv_proj", hidden, (h + 2 * kv) * d),
                ("self_attn", "o_proj", h * d, hidden),
                ("mlp", "gate_up_proj", hidden, 2 * ffn), ("mlp", "down_proj", ffn, hidden)]
    out = [("self_attn", "q_proj", hidden, h * d), ("self_attn", "k_proj", hidden, kv * d),
           ("self_attn", "v_proj", hidden, kv * d), ("self_attn", "o_proj", h * d, hidden)]
    if not ("MoeForCausalLM" in arch or arch == "MixtralForCausalLM"):
        out += [("mlp", "gate_proj", hidden, ffn), ("mlp", "up_proj", hidden, ffn),
                ("mlp", "down_proj", ffn, hidden)]
    return out


def write_adapter(cfg, out_dir, seed, rank=8, alpha=16.0, rslora=False, amplitude=0.1):
    """A random adapter for the model of config `cfg` in `out_dir`; returns {model weight name:
    (A, B)} in float64 (what a reference merges as W + scale * B @ A)."""
    rng = np.random.default_rng(seed)
    modules = modules_of(cfg)
    header, blobs, merged, offset = {}, [], {}, 0
    for layer in range(cfg["num_hidden_layers"]):
        for parent, name, n_in, n_out in modules:
            a = rng.uniform(-amplitude, amplitude, size=(rank, n_in)).astype(np.float32)
            b = rng.uniform(-amplitude, amplitude, size=(n_out, rank)).astype(np.float32)
            stem = f"base_model.model.model.layers.{layer}.{parent}.{name}"
            for suffix, t in (("lora_A", a), ("lora_B", b)):
                raw = t.tobytes()
                header[f"{stem}.{suffix}.weight"] = {
                    "dtype": "F32", "shape": list(t.shape),
                    "data_offsets": [offset, offset + len(raw)]}
                blobs.append(raw)
                offset += len(raw)
            merged[f"model.layers.{layer}.{parent}.{name}.weight"] = (
                a.astype(np.float64), b.astype(np.float64))
    os.makedirs(out_dir)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                   "lora_alpha": alpha, "use_rslora": rslora, "bias": "none",
                   "lora_dropout": 0.0, "target_modules": sorted({m[1] for m in modules}),
                   "base_model_name_or_path": "random"}, f)
    return merged
