#!/usr/bin/env python3
"""Writes fp8 (e4m3) checkpoints of a dense Llama checkpoint as published formats lay them out,
for tests.

An independent implementation (numpy only; it shares no code with Tandem; the Debian torch here
has no float8 types), quantizing as llm-compressor and fbgemm do: per output channel (or per
tensor) scale = max|w| / 448, codes = clamp(w / scale, -448, 448) rounded to the nearest e4m3
value, ties to the even code (the codes' table is built from the format's definition: sign,
4 exponent bits of bias 7, 3 mantissa bits, exponent 0 subnormal, S.1111.111 NaN).

  compressed-tensors  quantization_config {quant_method "compressed-tensors", format
                      "float-quantized", config_groups.group_0.weights {num_bits 8, type float,
                      strategy channel|tensor, symmetric, dynamic false}, input_activations
                      {num_bits 8, type float, strategy token, dynamic true} (FP8-dynamic),
                      ignore [lm_head]}; <proj>.weight F8_E4M3 [out, in], <proj>.weight_scale
                      [out, 1] (channel) or [1] (tensor) in the checkpoint's dtype.
  fbgemm_fp8          quantization_config {quant_method "fbgemm_fp8", activation_scale_ub,
                      modules_to_not_convert [lm_head]}; weight F8_E4M3, weight_scale F32
                      [out, 1], input_scale_ub F32 [1].
  fp8                 vLLM's own: {quant_method "fp8", activation_scheme "dynamic"}; weight
                      F8_E4M3, weight_scale F32 [] (per tensor).

Projections q/k/v/o/gate/up/down are quantized; everything else is stored in --dtype. With
--dequant-out, also writes an f32 checkpoint of exactly the values the fp8 one means: every
projection float32(code) * float32(scale) (one float32 product), every other tensor its stored
value.

Usage: fp8_checkpoint_packer.py SRC OUT --format compressed-tensors|fbgemm_fp8|fp8
         [--strategy channel|tensor] [--dtype f32|bf16] [--dequant-out DIR]
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np

PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def e4m3_magnitudes():
    """Values of the codes 0..126 (126 = 0x7e = 448; 127 is NaN), in increasing order."""
    vals = []
    for c in range(127):
        e, m = c >> 3, c & 7
        vals.append(np.ldexp(m / 8.0, -6) if e == 0 else np.ldexp(1.0 + m / 8.0, e - 7))
    return np.array(vals, dtype=np.float64)


MAGS = e4m3_magnitudes()


def to_e4m3(x):
    """Codes (uint8) of float32 x, |x| <= 448: nearest value, ties to the even code."""
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(MAGS, a, side="left"), 0, 126)  # first value >= a
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - MAGS[lo], MAGS[hi] - a
    code = np.where(dhi < dlo, hi, np.where(dlo < dhi, lo, np.where(hi % 2 == 0, hi, lo)))
    code = np.where(a == MAGS[hi], hi, code).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def from_e4m3(codes):
    v = MAGS[(codes & 0x7f).astype(np.int64)].astype(np.float32)
    return np.where(codes & 0x80, -v, v).astype(np.float32)


def bf16_round(x):
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7fff + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class T:
    """A stored tensor: safetensors dtype name, shape, raw array."""

    def __init__(self, dtype, arr):
        self.dtype, self.arr = dtype, arr

    def f32(self):
        if self.dtype == "BF16":
            return bf16_value(self.arr)
        if self.dtype == "F8_E4M3":
            return from_e4m3(self.arr)
        return self.arr.astype(np.float32)


def stored(x, dtype):
    return T("BF16", bf16_round(x)) if dtype == "bf16" else T("F32", x.astype(np.float32))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        arr = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=kinds[e["dtype"]])
        out[name] = T(e["dtype"], arr.reshape(e["shape"])).f32()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        raw = np.ascontiguousarray(t.arr).tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def quantize(w, per_channel):
    """fp8 codes of w [N, K] (float32) and the float32 scales [N, 1] or [1]."""
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max().reshape(1)
    scale = (amax / np.float32(448.0)).astype(np.float32)
    scale[scale == 0] = 1
    div = (w / (scale if per_channel else scale[0])).astype(np.float32)
    return to_e4m3(np.clip(div, -448.0, 448.0)), scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--format", required=True,
                    choices=["compressed-tensors", "fbgemm_fp8", "fp8"])
    ap.add_argument("--strategy", default="channel", choices=["channel", "tensor"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--dequant-out")
    a = ap.parse_args()
    if a.format == "fbgemm_fp8" and a.strategy != "channel":
        raise SystemExit("fbgemm_fp8 is per channel")
    if a.format == "fp8" and a.strategy != "tensor":
        raise SystemExit("vLLM's fp8 format is per tensor")
    src = read_safetensors(os.path.join(a.src, "model.safetensors"))
    config = json.load(open(os.path.join(a.src, "config.json")))
    out, dequant = {}, {}
    for name, t in src.items():
        st = stored(t, a.dtype)
        proj = name.endswith(".weight") and any(f".{p}." in name for p in PROJECTIONS)
        if not proj:
            out[name] = st
            dequant[name] = T("F32", st.f32())
            continue
        codes, scale = quantize(st.f32(), a.strategy == "channel")
        prefix = name[:-len(".weight")]
        out[name] = T("F8_E4M3", codes)
        if a.format == "compressed-tensors":  # llm-compressor stores scales in the model's dtype
            sc = stored(scale, a.dtype)
        elif a.format == "fbgemm_fp8":
            sc = T("F32", scale)
            out[prefix + ".input_scale_ub"] = T("F32", np.array([1200.0], dtype=np.float32))
        else:
            sc = T("F32", scale.reshape(()))
        out[prefix + ".weight_scale"] = sc
        dequant[name] = T("F32", (from_e4m3(codes) * sc.f32().reshape(-1, 1)).astype(np.float32))
    if a.format == "compressed-tensors":
        q = {"quant_method": "compressed-tensors", "format": "float-quantized",
             "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
             "config_groups": {"group_0": {
                 "targets": ["Linear"],
                 "weights": {"num_bits": 8, "type": "float", "strategy": a.strategy,
                             "symmetric": True, "dynamic": False, "group_size": None,
                             "block_structure": None, "observer": "minmax"},
                 "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                       "symmetric": True, "dynamic": True, "observer": None},
                 "output_activations": None}}}
    elif a.format == "fbgemm_fp8":
        q = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
             "modules_to_not_convert": ["lm_head"]}
    else:
        q = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    for d, tensors, qc in ((a.out, out, q), (a.dequant_out, dequant, None)):
        if d is None:
            continue
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(a.src):
            p = os.path.join(a.src, f)
            if os.path.isfile(p) and f not in ("model.safetensors", "config.json"):
                shutil.copy(p, os.path.join(d, f))
        c = dict(config)
        c["torch_dtype"] = "bfloat16" if qc is not None and a.dtype == "bf16" else "float32"
        if qc is not None:
            c["quantization_config"] = qc
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)


if __name__ == "__main__":
    main()
