#!/usr/bin/env python3
"""Writes a Tandem (Hugging Face layout) Llama or Mixtral model as a BF16 GGUF file for llama.cpp.

  peer_gguf.py MODEL_DIR LLAMA_CPP_SRC OUT.gguf

The peer must serve the same weights as Tandem, so this copies the model's bf16 values bit for
bit (norms as f32) through llama.cpp's own GGUF library (LLAMA_CPP_SRC/gguf-py: its writer, its
tensor-name map from Hugging Face names, its metadata keys); llama-quantize then makes the f16,
q8_0 and q4_0 files from it. Debian's python3 with numpy is enough: no torch, no safetensors
package (the snapshot's convert_hf_to_gguf.py needs both, and its llama2.c converter holds the
whole model as f32 in a fixed 2 GiB arena, too small for the 1B shape).

What the GGUF needs beyond the tensors, done as llama.cpp's Hugging Face converter does it:
  - q and k projections are stored with each head's rotary halves interleaved (Hugging Face
    keeps them as two halves), so their rows are permuted per head;
  - llama3 rope scaling is a per-frequency factor tensor (rope_freqs);
  - the vocabulary is the sentencepiece-style token list of tokenizer.json with token types.
    Scores only steer llama.cpp's tokenizer, and the benchmark sends token ids, so they are a
    plain rank order;
  - Mixtral is llama.cpp's llama architecture with expert_count / expert_used_count: each
    layer's experts are stacked into one 3-D tensor per projection (w1 -> ffn_gate_exps,
    w2 -> ffn_down_exps, w3 -> ffn_up_exps, [experts, out, in]) and the router
    (block_sparse_moe.gate -> ffn_gate_inp) is kept as f32, as the converter's output has it.
"""

import json
import math
import struct
import sys
import types
from pathlib import Path

import numpy as np


def load_gguf_module(llama_cpp_src):
    sys.path.insert(0, str(Path(llama_cpp_src) / "gguf-py"))
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        # gguf-py imports sentencepiece for vocab classes this script does not use.
        stub = types.ModuleType("sentencepiece")
        stub.SentencePieceProcessor = None
        sys.modules["sentencepiece"] = stub
    import gguf

    return gguf


def safetensors_tensors(model_dir):
    """name -> (dtype string, shape, memory-mapped raw array) over every shard of the model."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    out = {}
    for name in files:
        path = model_dir / name
        with open(path, "rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_len))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[tensor] = (info["dtype"], info["shape"], data[begin:end])
    return out


def as_bf16_bits(dtype, shape, raw):
    """The tensor's bf16 bit patterns (uint16), shaped."""
    if dtype == "BF16":
        return raw.view(np.uint16).reshape(shape)
    if dtype == "F32":
        bits = raw.view(np.uint32).reshape(shape)
        # Round to nearest even, as bf16 conversion does.
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype(np.uint16)
    raise ValueError(f"unsupported safetensors dtype {dtype}")


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def interleave_rotary_halves(w, n_heads):
    """Per head, rows [x0..x(d/2-1), y0..] become [x0, y0, x1, y1, ...]."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(config, head_dim):
    scaling = config.get("rope_scaling") or {}
    if (scaling.get("rope_type") or scaling.get("type") or "").lower() != "llama3":
        return None
    base = config.get("rope_theta", 10000.0)
    factor = scaling.get("factor", 8.0)
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_vocab(gguf, writer, model_dir, vocab_size):
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    pieces = [""] * vocab_size
    for piece, i in tok["model"]["vocab"].items():
        if i < vocab_size:
            pieces[i] = piece
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    types_, scores = [], []
    for i, piece in enumerate(pieces):
        if not piece:
            pieces[i] = f"[PAD{i}]"
            types_.append(gguf.TokenType.UNUSED)
        elif i == 0:
            types_.append(gguf.TokenType.UNKNOWN)
        elif i in special:
            types_.append(gguf.TokenType.CONTROL)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            types_.append(gguf.TokenType.BYTE)
        else:
            types_.append(gguf.TokenType.NORMAL)
        scores.append(-float(i))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types_)


def stack_experts(tensors, n_layers, n_experts):
    """Each layer's experts.{e}.w{1,2,3} become one layers.{bid}.feed_forward.experts.w{1,2,3}
    tensor [experts, out, in] (the merged names llama.cpp's tensor map knows), in bf16 bits."""
    if not n_experts:
        return tensors
    out = {}
    for bid in range(n_layers):
        for wid in ("w1", "w2", "w3"):
            parts = []
            for xid in range(n_experts):
                dtype, shape, raw = tensors.pop(
                    f"model.layers.{bid}.block_sparse_moe.experts.{xid}.{wid}.weight")
                parts.append(as_bf16_bits(dtype, shape, raw))
            stacked = np.stack(parts)
            out[f"layers.{bid}.feed_forward.experts.{wid}.weight"] = (
                "BF16", list(stacked.shape), stacked.reshape(-1).view(np.uint8))
    leftover = [n for n in tensors if ".experts." in n]
    if leftover:
        sys.exit(f"peer_gguf.py: experts beyond num_local_experts: {leftover[:3]}")
    out.update(tensors)
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model_dir, llama_cpp_src, out_path = sys.argv[1:]
    gguf = load_gguf_module(llama_cpp_src)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("model_type") not in ("llama", "mixtral"):
        sys.exit(f"peer_gguf.py: only llama and mixtral models, not {config.get('model_type')}")
    n_experts = config.get("num_local_experts", 0) if config["model_type"] == "mixtral" else 0
    n_layers = config["num_hidden_layers"]
    n_heads = config["num_attention_heads"]
    n_kv_heads = config.get("num_key_value_heads", n_heads)
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim", hidden // n_heads)
    vocab_size = config["vocab_size"]

    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_name(Path(model_dir).name)
    writer.add_vocab_size(vocab_size)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-5))
    if n_experts:
        writer.add_expert_count(n_experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    add_vocab(gguf, writer, model_dir, vocab_size)
    writer.add_bos_token_id(config.get("bos_token_id", 1))
    eos = config.get("eos_token_id", 2)
    writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    factors = llama3_rope_factors(config, head_dim)
    if factors is not None:
        writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    tensors = safetensors_tensors(model_dir)
    if "lm_head.weight" not in tensors:  # tied embeddings: the peer gets its own copy
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    tensors = stack_experts(tensors, n_layers, n_experts)
    for hf_name, (dtype, shape, raw) in tensors.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            sys.exit(f"peer_gguf.py: no GGUF name for {hf_name}")
        bits = as_bf16_bits(dtype, shape, raw)
        if hf_name.endswith("q_proj.weight"):
            bits = interleave_rotary_halves(bits, n_heads)
        elif hf_name.endswith("k_proj.weight"):
            bits = interleave_rotary_halves(bits, n_kv_heads)
        if len(shape) == 1 or hf_name.endswith("block_sparse_moe.gate.weight"):
            writer.add_tensor(name, bf16_to_f32(bits))
        else:
            raw_bytes = np.ascontiguousarray(bits).view(np.uint8)
            writer.add_tensor(name, raw_bytes, raw_shape=raw_bytes.shape,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
