#!/usr/bin/env python3
"""Writes AWQ (GEMM) and GPTQ int4 checkpoints of a dense Llama checkpoint, for tests.

An independent implementation of the formats (numpy only; it shares no code with Tandem):

  AWQ GEMM  qweight I32 [in, out/8]: bits 4i..4i+3 of word [k, c] hold q[8c + ORDER[i], k] with
            ORDER = 0, 2, 4, 6, 1, 3, 5, 7; qzeros I32 [in/group, out/8] packed the same way;
            scales F16 [in/group, out]. w = (q - zero) * scale.
  GPTQ      qweight I32 [in/8, out]: bits 4i..4i+3 of word [r, n] hold q[n, 8r + i];
            qzeros I32 [in/group, out/8]: bits 4i..4i+3 of word [g, c] hold the zero of output
            8c + i, minus one in checkpoint_format "gptq" (v1: a stored nibble s means zero s + 1)
            and as is in "gptq_v2"; scales F16 [in/group, out]; g_idx I32 [in] (group of each
            input channel; act-order permutes it). w = (q - zero[g_idx[k]]) * scale[g_idx[k]].

Weights are quantized round-to-nearest per group (asymmetric over [min(w, 0), max(w, 0)], or
symmetric with zero 8). Projections q/k/v/o/gate/up/down are quantized; embeddings, norms and an
untied lm_head are stored as f16. --dequant-out also writes an f32 checkpoint holding exactly the
values the quantized one means: every projection (q - zero) * scale evaluated in float32, every
other tensor its f16 value.

Usage: int4_checkpoint_packer.py SRC OUT --format awq|gptq [--group 64] [--sym] [--act-order]
         [--gptq-version 1|2] [--quantize-config-json] [--force-zero0] [--dense PROJ,..]
         [--dequant-out DIR]
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        if e["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).astype(np.float32)
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def quantize(w, group, sym, act_order):
    """RTN int4 of w [N, K]: codes q [N, K], zeros [N, G], f16 scales [N, G], g_idx [K]."""
    n, k = w.shape
    group = k if group == -1 else group  # GPTQ group_size -1: one group per output channel
    groups = k // group
    if act_order:  # most important input channels first, as GPTQ's act-order does
        perm = np.argsort(-(w.astype(np.float64) ** 2).sum(axis=0), kind="stable")
    else:
        perm = np.arange(k)
    g_idx = np.empty(k, dtype=np.int32)
    g_idx[perm] = np.arange(k) // group
    q = np.zeros((n, k), dtype=np.int64)
    zeros = np.zeros((n, groups), dtype=np.int64)
    scales = np.zeros((n, groups), dtype=np.float16)
    for g in range(groups):
        cols = perm[g * group:(g + 1) * group]
        wg = w[:, cols].astype(np.float32)
        if sym:
            amax = np.abs(wg).max(axis=1)
            s = 2 * amax / 15
            s[s == 0] = 1
            z = np.full(n, 8)
        else:
            lo = np.minimum(wg.min(axis=1), 0)
            hi = np.maximum(wg.max(axis=1), 0)
            s = (hi - lo) / 15
            s[s == 0] = 1
            z = np.clip(np.rint(-lo / s), 0, 15).astype(np.int64)
        s16 = s.astype(np.float16)
        q[:, cols] = np.clip(np.rint(wg / s16.astype(np.float32)[:, None]) + z[:, None], 0, 15)
        zeros[:, g] = z
        scales[:, g] = s16
    return q, zeros, scales, g_idx


def pack_nibbles(v, axis_order):
    """v [..., 8] of nibbles -> uint32 words, nibble i taken from v[..., axis_order[i]]."""
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i, src in enumerate(axis_order):
        words |= (v[..., src].astype(np.uint32) & 15) << np.uint32(4 * i)
    return words.view(np.int32)


def pack(fmt, q, zeros, scales, g_idx, version):
    """Stored tensors and the zeros they mean (after the v1 offset)."""
    n, k = q.shape
    groups = zeros.shape[1]
    if fmt == "awq":
        qweight = pack_nibbles(q.T.reshape(k, n // 8, 8), AWQ_ORDER)
        qzeros = pack_nibbles(zeros.T.reshape(groups, n // 8, 8), AWQ_ORDER)
        meant = zeros
        out = {"qweight": qweight, "qzeros": qzeros, "scales": np.ascontiguousarray(scales.T)}
    else:
        offset = 1 if version == 1 else 0
        stored = (zeros - offset) & 15  # v1: zero 0 is stored as 15 and means 16
        meant = stored + offset
        qweight = pack_nibbles(q.T.reshape(k // 8, 8, n).transpose(0, 2, 1), range(8))
        qzeros = pack_nibbles(stored.T.reshape(groups, n // 8, 8), range(8))
        out = {"qweight": qweight, "qzeros": qzeros, "scales": np.ascontiguousarray(scales.T),
               "g_idx": g_idx}
    return out, meant


def dequantize(q, meant_zeros, scales, g_idx):
    z = meant_zeros[:, g_idx].astype(np.float32)
    s = scales[:, g_idx].astype(np.float32)
    return (q.astype(np.float32) - z) * s  # one float32 product of exact operands


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--format", choices=["awq", "gptq"], required=True)
    p.add_argument("--group", type=int, default=64, help="group size; -1 (GPTQ): per channel")
    p.add_argument("--sym", action="store_true")
    p.add_argument("--act-order", action="store_true")
    p.add_argument("--gptq-version", type=int, choices=[1, 2], default=1)
    p.add_argument("--quantize-config-json", action="store_true",
                   help="GPTQ: settings in quantize_config.json (AutoGPTQ) instead of config.json")
    p.add_argument("--dequant-out")
    p.add_argument("--dense", default="",
                   help="comma-separated projection names kept dense f16 (e.g. mlp.down_proj), "
                        "as AWQ's modules_to_not_convert does")
    p.add_argument("--force-zero0", action="store_true",
                   help="make layer 0 q_proj row 0's first group non-negative, so its zero point "
                        "is 0 (GPTQ v1 stores it as 15, meaning 16)")
    a = p.parse_args()
    if a.format == "awq" and (a.sym or a.act_order):
        sys.exit("AWQ GEMM checkpoints are asymmetric and not act-ordered")

    with open(os.path.join(a.src, "config.json")) as f:
        config = json.load(f)
    src = read_safetensors(os.path.join(a.src, "model.safetensors"))
    packed, dense = {}, {}
    for name, w in src.items():
        prefix = name[:-len(".weight")]
        dense_proj = any(prefix.endswith(d) for d in a.dense.split(",") if d)
        if any(prefix.endswith(proj) for proj in PROJECTIONS) and not dense_proj:
            if a.force_zero0 and name == "model.layers.0.self_attn.q_proj.weight":
                w = w.copy()
                w[0, :a.group] = np.abs(w[0, :a.group])
            q, zeros, scales, g_idx = quantize(w, a.group, a.sym, a.act_order)
            stored, meant = pack(a.format, q, zeros, scales, g_idx, a.gptq_version)
            for suffix, arr in stored.items():
                packed[prefix + "." + suffix] = arr
            dense[name] = dequantize(q, meant, scales, g_idx)
        else:
            packed[name] = w.astype(np.float16)
            dense[name] = packed[name].astype(np.float32)

    if a.format == "awq":
        qc = {"quant_method": "awq", "bits": 4, "group_size": a.group, "zero_point": True,
              "version": "gemm",
              "modules_to_not_convert": a.dense.split(",") if a.dense else None}
    else:
        qc = {"quant_method": "gptq", "bits": 4, "group_size": a.group, "desc_act": a.act_order,
              "sym": a.sym, "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
              "checkpoint_format": "gptq" if a.gptq_version == 1 else "gptq_v2"}
    for d, tensors, quantized in [(a.out, packed, True), (a.dequant_out, dense, False)]:
        if d is None:
            continue
        os.makedirs(d, exist_ok=True)
        c = dict(config)
        c["torch_dtype"] = "float16" if quantized else "float32"
        if quantized and a.quantize_config_json:
            with open(os.path.join(d, "quantize_config.json"), "w") as f:
                json.dump(qc, f, indent=2)
        elif quantized:
            c["quantization_config"] = qc
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        for extra in ["generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "special_tokens_map.json"]:
            if os.path.exists(os.path.join(a.src, extra)):
                shutil.copy(os.path.join(a.src, extra), os.path.join(d, extra))


if __name__ == "__main__":
    main()
