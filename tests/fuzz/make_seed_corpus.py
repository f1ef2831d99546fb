#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/{tokenizer,model,kvtransfer} (deterministic; rerun after
a format change and commit the result). Inputs of fixed findings (regression-*) are kept."""
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target_dir, name, data):
    os.makedirs(target_dir, exist_ok=True)
    with open(os.path.join(target_dir, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def clear(target_dir):
    if os.path.isdir(target_dir):
        for f in os.listdir(target_dir):
            if not f.startswith("regression-"):
                os.unlink(os.path.join(target_dir, f))


def tokenizer():
    d = os.path.join(HERE, "tokenizer", "corpus", "tokenizer_fuzzer")
    clear(d)
    texts = ["Once upon a time, there was a little girl named Lily.", "  leading spaces",
             "trailing  ", "tabs\tand\nnewlines\r\n", "<s>hello</s>", "<|begin_of_text|>hi",
             "<|im_start|>user\nhi<|im_end|>", "émigré café naïve", "e\u0301 composed",
             "日本語のテキスト", "한국어", "emoji 😀👍🏽 family 👨‍👩‍👧", "\u2581\u2581 sentencepiece",
             "123456789 3.14159", "don't you'll I'm", "\x00\x01\x1b[0m", "a" * 300,
             "\u200b\u2028\ufeff", "ﬁ ligature Ⅻ"]
    i = 0
    for t in texts:
        for tok in range(5):
            write(d, f"text-{i:03d}", bytes([tok | (0x30 if i % 2 else 0x10), 0]) + t.encode())
            i += 1
    write(d, "invalid-utf8", bytes([0x01, 0]) + b"ab\xff\xfe\xc0\x80")
    for tok in range(5):
        ids = b"".join(struct.pack("<H", x) for x in range(0, 600, 7))
        write(d, f"ids-{tok}", bytes([tok | 0x40, 1]) + ids)


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def model():
    d = os.path.join(HERE, "model", "corpus", "safetensors_fuzzer")
    clear(d)
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    write(d, "one-f32", safetensors_file([("w", "F32", [2, 2], f32)]))
    write(d, "mixed", safetensors_file([("a", "BF16", [3], b"\x00\x3f" * 3),
                                        ("b", "F16", [1, 2], b"\x00\x3c" * 2),
                                        ("empty", "F32", [0, 4], b"")], {"format": "pt"}))
    write(d, "scalar", safetensors_file([("s", "F32", [], struct.pack("<f", 7))]))
    write(d, "truncated", safetensors_file([("w", "F32", [2, 2], f32)])[:-3])
    write(d, "bad-dtype", safetensors_file([("w", "I64", [2], b"\x00" * 16)]))
    write(d, "empty-header", struct.pack("<Q", 2) + b"{}")
    with open(os.path.join(ROOT, "models", "stories260k", "model.safetensors"), "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0]
        real = json.loads(f.read(n))
    # The real header with its tensors shrunk to a few bytes each.
    small = [(k, v["dtype"], [1] * len(v["shape"]), b"\x00" * 4) for k, v in real.items()
             if k != "__metadata__"][:6]
    write(d, "stories260k-shape", safetensors_file(small))

    d = os.path.join(HERE, "model", "corpus", "model_config_fuzzer")
    clear(d)
    for m in ("stories260k", "llama2xs-280k"):
        with open(os.path.join(ROOT, "models", m, "config.json")) as f:
            write(d, f"{m}.json", f.read())
    base = json.load(open(os.path.join(ROOT, "models", "stories260k", "config.json")))
    v = dict(base, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192},
             eos_token_id=[2, 3])
    write(d, "llama3-rope.json", json.dumps(v))
    v = dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2", sliding_window=4096,
             use_sliding_window=False, torch_dtype="bfloat16")
    write(d, "qwen2.json", json.dumps(v))
    v = dict(base, architectures=["MistralForCausalLM"], model_type="mistral",
             rope_scaling={"type": "linear", "factor": 2.0})
    write(d, "mistral-linear.json", json.dumps(v))
    write(d, "not-an-object.json", "[1, 2, 3]")


def frame(ftype, meta, flags=0):
    return struct.pack("<IHHII", 0x46564b54, ftype, flags, len(meta),
                       crc32c(meta)) + meta


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def s(b):
    return struct.pack("<I", len(b)) + b


def blocks(ids):
    return struct.pack("<I", len(ids)) + b"".join(struct.pack("<i", i) for i in ids)


def layout():
    return struct.pack("<I", 2) + s(b"stories260k") + struct.pack("<qqqqB", 5, 4, 8, 16, 1)


def kvtransfer():
    d = os.path.join(HERE, "kvtransfer", "corpus", "kv_wire_fuzzer")
    clear(d)
    hello = struct.pack("<I", 0x4d444e54) + layout()
    welcome = struct.pack("<Q", 77) + layout() + s(bytes(range(32)))
    challenge = s(bytes(range(64, 96)))
    auth = s(bytes(range(32, 64))) + s(bytes(range(96, 128)))
    begin = struct.pack("<QIQq", 5, 1, 77, 30000) + blocks([3, 4, 9])
    data = struct.pack("<QIIQ", 5, 1, 2, 3 * 2048) + blocks([3, 4, 9])
    finish = struct.pack("<QIQQ", 5, 1, 5, 5 * 3 * 2048) + s(b"\x08\x01\x10\x02")
    outcome = struct.pack("<QII", 5, 1, 15) + s(b"checksum mismatch in layer 2")
    write(d, "prefix", bytes([0]) + frame(6, finish))
    write(d, "prefix-data-checksum", bytes([0]) + frame(5, data, flags=1))
    write(d, "hello", bytes([1]) + hello)
    write(d, "welcome", bytes([2]) + welcome)
    write(d, "welcome-no-proof", bytes([2]) + struct.pack("<Q", 77) + layout() + s(b""))
    write(d, "challenge", bytes([8]) + challenge)
    write(d, "auth", bytes([9]) + auth)
    write(d, "auth-no-secret", bytes([9]) + s(b"") + s(b""))
    write(d, "prefix-auth", bytes([0]) + frame(10, auth))
    write(d, "begin", bytes([3]) + begin)
    write(d, "begin-no-deadline", bytes([3]) + struct.pack("<QIQq", 1, 0, 1, -1) + blocks([]))
    write(d, "data", bytes([4]) + data)
    write(d, "finish", bytes([5]) + finish)
    write(d, "outcome", bytes([6]) + outcome)
    write(d, "outcome-ok", bytes([6]) + struct.pack("<QII", 5, 1, 0) + s(b""))
    write(d, "frame", bytes([7]) + finish)

    d = os.path.join(HERE, "kvtransfer", "corpus", "kv_receiver_core_fuzzer")
    clear(d)
    # expect(id 1: blocks 2, 5), begin(attempt 1), data layer 0 and 1, finish.
    ok = bytes([0, 1, 0, 1, 2, 5]) + bytes([1, 1, 1, 0, 1]) + \
        bytes([2, 1, 1, 0, 2, 2, 5, 1]) + bytes([2, 1, 1, 1, 2, 2, 5, 1]) + bytes([3, 1, 1, 2, 1])
    write(d, "complete", ok)
    write(d, "retry", ok[:6] + bytes([1, 1, 1, 0, 1]) + bytes([2, 1, 1, 0, 2, 2, 5, 0]) +
          bytes([1, 1, 2, 0, 1]) + bytes([2, 1, 2, 0, 2, 2, 5, 1]) + bytes([4, 1, 2]))
    write(d, "cancel-mid", ok[:6] + bytes([1, 1, 1, 0, 1]) + bytes([5, 1, 1]) +
          bytes([2, 1, 1, 0, 2, 2, 5, 1]))
    write(d, "foreign-blocks", ok[:6] + bytes([1, 1, 1, 0, 1]) + bytes([2, 1, 1, 0, 2, 7, 0xff, 1]))
    write(d, "lost-connection", ok[:11] + bytes([6, 1, 1, 0]) + bytes([2, 1, 1, 0, 2, 2, 5, 1]))


if __name__ == "__main__":
    tokenizer()
    model()
    kvtransfer()
