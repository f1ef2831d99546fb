"""Reads a Hugging Face model directory's safetensors (single file or index + shards) into numpy
float64 arrays, straight from the format's definition: 8-byte little-endian header length, a
JSON header {name: {dtype, shape, data_offsets}}, then the data. Independent of the C++ loader."""
import json
import os

import numpy as np


def _to_float64(raw, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2")
    elif dtype == "BF16":  # the top 16 bits of an f32
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(f"dtype {dtype} not handled by the reference")
    return a.astype(np.float64).reshape(shape)


def _read_file(path, out):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        out[name] = _to_float64(data[base + begin:base + end], e["dtype"], e["shape"])


def load_tensors(model_dir):
    out = {}
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        _read_file(single, out)
        return out
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    for shard in sorted(set(index["weight_map"].values())):
        _read_file(os.path.join(model_dir, shard), out)
    return out
