"""The bad-input corpus: hand-made protobuf wire bytes and requests at and beyond
every bound, each with the status it must get. Shared by serve_bad_input_corpus_test.py (client
API) and worker_bad_input_test.py (worker API).

A case is (name, payload, expectation): payload is raw bytes or a request message; expectation
is a status code name (with an optional substring of the message: "INVALID_ARGUMENT:top_p") or
"OK" (the stream completes normally) or a set of acceptable codes."""
import math
import random
import struct

I32_MAX, I32_MIN = 2**31 - 1, -2**31


def varint(n):
    n &= (1 << 64) - 1  # negatives as 10-byte two's complement, like protobuf
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire_type):
    return varint(field << 3 | wire_type)


def vint(field, n):
    return key(field, 0) + varint(n)


def ld(field, data):
    if isinstance(data, str):
        data = data.encode()
    return key(field, 2) + varint(len(data)) + data


def f32(field, x):
    return key(field, 5) + struct.pack("<f", x)


def f64(field, x):
    return key(field, 1) + struct.pack("<d", x)


# GenerateRequest fields.
TEXT, TOKEN_IDS, SAMPLING, N = 3, 4, 5, 6
# SamplingParams fields.
TEMPERATURE, TOP_K, TOP_P, MIN_P, REP, PRES, FREQ, BIAS, SEED, MAX_TOKENS = range(1, 11)
MIN_TOKENS, IGNORE_EOS, STOP_IDS, STOP, INCLUDE_STOP, LOGPROBS = 11, 12, 13, 14, 15, 16

HI = ld(TEXT, "Once upon a time")


def sampling(*fields):
    return ld(SAMPLING, b"".join(fields))


def wire_cases():
    """Malformed, oversize, unknown-field and wrong-type GenerateRequest bytes."""
    bad = "INVALID_ARGUMENT:request"
    return [
        ("empty message", b"", "INVALID_ARGUMENT:prompt"),
        ("truncated varint", b"\x30", bad),
        ("overlong varint (11 bytes)", b"\x30" + b"\xff" * 10 + b"\x01", bad),
        ("length beyond the buffer", b"\x1a\x32A", bad),
        ("length beyond 2 GiB", b"\x1a" + varint(2**31 + 5) + b"A", bad),
        ("wire type 6", b"\x1e\x00", bad),
        ("wire type 7", b"\x1f\x00", bad),
        ("field number 0", b"\x02\x01A", bad),
        ("field number beyond 2^29", key(2**29, 0) + b"\x01", bad),
        ("unterminated group", b"\x0b" + HI, bad),
        ("end group without start", b"\x0c" + HI, bad),
        ("sampling: garbage inside", ld(SAMPLING, b"\xff\xff\xff") + HI, bad),
        ("sampling: truncated float", HI + ld(SAMPLING, key(TEMPERATURE, 5) + b"\x00\x00"), bad),
        ("token_ids: truncated packed list", ld(TOKEN_IDS, ld(1, b"\x05\x06\x80")), bad),
        ("text: invalid UTF-8", ld(TEXT, b"\xff\xfeA"), "INVALID_ARGUMENT:UTF-8"),
        ("text: overlong UTF-8 NUL", ld(TEXT, b"A\xc0\x80"), "INVALID_ARGUMENT:UTF-8"),
        ("text: UTF-16 surrogate", ld(TEXT, b"A\xed\xa0\x80"), "INVALID_ARGUMENT:UTF-8"),
        ("stop: invalid UTF-8", HI + sampling(ld(STOP, b"\xff")), "INVALID_ARGUMENT:stop"),
        ("request_id: invalid UTF-8", ld(1, b"\xc3") + HI, "INVALID_ARGUMENT:request_id"),
        ("model: invalid UTF-8", ld(2, b"\xe2\x82") + HI, "INVALID_ARGUMENT:model"),
        ("cache_salt: invalid UTF-8", ld(8, b"\xf5\x80\x80\x80") + HI,
         "INVALID_ARGUMENT:cache_salt"),
        # Unknown fields are skipped (proto3), in the request and inside sampling.
        ("unknown varint field", HI + vint(99, 7) + sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("unknown length-delimited field", HI + ld(1000, b"\x00" * 1000) +
         sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("unknown fixed32/fixed64 fields", HI + key(77, 5) + b"abcd" + key(78, 1) + b"abcdefgh" +
         sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("unknown fields inside sampling", HI + sampling(vint(MAX_TOKENS, 2), vint(500, 1),
                                                        ld(501, "x")), "OK"),
        ("unknown group", HI + key(90, 3) + vint(1, 1) + key(90, 4) +
         sampling(vint(MAX_TOKENS, 2)), "OK"),
        # Known field numbers with the wrong wire type are unknown fields.
        ("text sent as a varint", vint(TEXT, 5), "INVALID_ARGUMENT:prompt"),
        ("n sent as bytes", HI + ld(N, "16") + sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("sampling sent as a varint", HI + vint(SAMPLING, 3), "OK"),
        ("temperature sent as a varint", HI + sampling(vint(TEMPERATURE, 5), vint(MAX_TOKENS, 2)),
         "OK"),
        ("max_tokens sent as fixed64", HI + sampling(f64(MAX_TOKENS, 1e9)), "OK"),
        # Values of the right type that do not fit.
        ("n as a 64-bit varint (truncates to 2^31-1)", HI + vint(N, 2**31 - 1 + 2**40),
         "INVALID_ARGUMENT:n:"),
        ("n = -1 as a 10-byte varint", HI + vint(N, -1), "INVALID_ARGUMENT:n:"),
        ("repeated scalar text (last wins)", ld(TEXT, "A") + ld(TEXT, "Hi") +
         sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("text and token_ids (last oneof wins)", HI + ld(TOKEN_IDS, ld(1, varint(1) + varint(600))),
         "INVALID_ARGUMENT:token id 600"),
        ("unpacked token_ids", ld(TOKEN_IDS, vint(1, 1) + vint(1, 50)) +
         sampling(vint(MAX_TOKENS, 2)), "OK"),
        ("logit_bias entry without a value", HI + sampling(ld(BIAS, vint(1, 5)),
                                                          vint(MAX_TOKENS, 2)), "OK"),
        ("logit_bias entry with a NaN value", HI + sampling(
            ld(BIAS, vint(1, 5) + f32(2, math.nan)), vint(MAX_TOKENS, 2)),
         "INVALID_ARGUMENT:logit_bias"),
    ]


PROMPT = [1, 10, 20, 30]  # the sampling cases' prompt (token ids)


def sampling_cases(vocab, context):
    """(name, sampling kwargs, expectation) at and beyond every bound of SamplingParams, for the
    4-token PROMPT on a model with `vocab` tokens and `context` positions."""
    ok, inv = "OK", "INVALID_ARGUMENT"
    nan, inf = math.nan, math.inf
    c = [
        ("temperature 0", dict(temperature=0), ok),
        ("temperature 1e-30 (denormal-scale)", dict(temperature=1e-30, seed=1), ok),
        ("temperature 1e-45", dict(temperature=1e-45, seed=1), ok),
        ("temperature 1e30", dict(temperature=1e30, seed=1), ok),
        ("temperature -1e-9", dict(temperature=-1e-9), f"{inv}:temperature"),
        ("temperature -0.0", dict(temperature=-0.0), ok),
        ("temperature NaN", dict(temperature=nan), f"{inv}:temperature"),
        ("temperature inf", dict(temperature=inf), f"{inv}:temperature"),
        ("top_k 0", dict(top_k=0, temperature=1, seed=1), ok),
        ("top_k 1", dict(top_k=1, temperature=1, seed=1), ok),
        ("top_k vocab", dict(top_k=vocab, temperature=1, seed=1), ok),
        ("top_k vocab+1", dict(top_k=vocab + 1, temperature=1, seed=1), ok),
        ("top_k int32 max", dict(top_k=I32_MAX, temperature=1, seed=1), ok),
        ("top_k -1", dict(top_k=-1), f"{inv}:top_k"),
        ("top_k int32 min", dict(top_k=I32_MIN), f"{inv}:top_k"),
        ("top_p 1e-9", dict(top_p=1e-9, temperature=1, seed=1), ok),
        ("top_p 1", dict(top_p=1, temperature=1, seed=1), ok),
        ("top_p 0", dict(top_p=0), f"{inv}:top_p"),
        ("top_p 1.0000001", dict(top_p=1.0000001), f"{inv}:top_p"),
        ("top_p -1", dict(top_p=-1), f"{inv}:top_p"),
        ("top_p NaN", dict(top_p=nan), f"{inv}:top_p"),
        ("min_p 0", dict(min_p=0, temperature=1, seed=1), ok),
        ("min_p 1", dict(min_p=1, temperature=1, seed=1), ok),
        ("min_p -0.01", dict(min_p=-0.01), f"{inv}:min_p"),
        ("min_p 1.01", dict(min_p=1.01), f"{inv}:min_p"),
        ("min_p NaN", dict(min_p=nan), f"{inv}:min_p"),
        ("repetition_penalty 1e-30", dict(repetition_penalty=1e-30, temperature=1, seed=1), ok),
        ("repetition_penalty 1e30", dict(repetition_penalty=1e30, temperature=1, seed=1), ok),
        ("repetition_penalty 1e-45 greedy", dict(repetition_penalty=1e-45, temperature=0), ok),
        ("repetition_penalty 0", dict(repetition_penalty=0), f"{inv}:repetition_penalty"),
        ("repetition_penalty -1", dict(repetition_penalty=-1), f"{inv}:repetition_penalty"),
        ("repetition_penalty NaN", dict(repetition_penalty=nan), f"{inv}:repetition_penalty"),
        ("repetition_penalty inf", dict(repetition_penalty=inf), f"{inv}:repetition_penalty"),
    ]
    for field in ("presence_penalty", "frequency_penalty"):
        c += [(f"{field} -2", {field: -2, "temperature": 1, "seed": 1}, ok),
              (f"{field} 2", {field: 2, "temperature": 1, "seed": 1}, ok),
              (f"{field} -2.01", {field: -2.01}, f"{inv}:{field}"),
              (f"{field} 2.01", {field: 2.01}, f"{inv}:{field}"),
              (f"{field} NaN", {field: nan}, f"{inv}:{field}"),
              (f"{field} -inf", {field: -inf}, f"{inv}:{field}")]
    c += [
        ("logit_bias -100/100", dict(logit_bias={0: -100, vocab - 1: 100}), ok),
        ("logit_bias 100 on every token", dict(logit_bias={i: 100 for i in range(vocab)},
                                               temperature=1, seed=1), ok),
        ("logit_bias -100 on every token", dict(logit_bias={i: -100 for i in range(vocab)},
                                                temperature=1, seed=1), ok),
        ("logit_bias 100.5", dict(logit_bias={5: 100.5}), f"{inv}:logit_bias"),
        ("logit_bias -inf", dict(logit_bias={5: -inf}), f"{inv}:logit_bias"),
        ("logit_bias id -1", dict(logit_bias={-1: 1}), f"{inv}:logit_bias"),
        ("logit_bias id vocab", dict(logit_bias={vocab: 1}), f"{inv}:logit_bias"),
        ("logit_bias 1025 entries", dict(logit_bias={i: 1 for i in range(1025)}),
         f"{inv}:logit_bias"),
        ("seed 0", dict(seed=0, temperature=1), ok),
        ("seed 2^64-1", dict(seed=2**64 - 1, temperature=1), ok),
        ("max_tokens 1", dict(max_tokens=1), ok),
        ("max_tokens 0", dict(max_tokens=0), f"{inv}:max_tokens"),
        ("max_tokens -1", dict(max_tokens=-1), f"{inv}:max_tokens"),
        ("max_tokens int32 max", dict(max_tokens=I32_MAX), f"{inv}:max_tokens"),
        ("max_tokens int32 min", dict(max_tokens=I32_MIN), f"{inv}:max_tokens"),
        ("max_tokens fills the context", dict(max_tokens=context - 4, ignore_eos=True), ok),
        ("max_tokens one past the context", dict(max_tokens=context - 3), f"{inv}:max_tokens"),
        ("min_tokens = max_tokens", dict(min_tokens=8, max_tokens=8), ok),
        ("min_tokens > max_tokens", dict(min_tokens=9, max_tokens=8), f"{inv}:min_tokens"),
        ("min_tokens -1", dict(min_tokens=-1), f"{inv}:min_tokens"),
        ("stop_token_ids every id", dict(stop_token_ids=list(range(vocab)), max_tokens=4), ok),
        ("stop_token_ids -1", dict(stop_token_ids=[-1]), f"{inv}:stop_token_ids"),
        ("stop_token_ids vocab", dict(stop_token_ids=[vocab]), f"{inv}:stop_token_ids"),
        ("stop_token_ids 1025", dict(stop_token_ids=[5] * 1025), f"{inv}:stop_token_ids"),
        ("stop 16 strings of 256 bytes", dict(stop=["é" * 128] * 16), ok),
        ("stop 17 strings", dict(stop=["x"] * 17), f"{inv}:stop"),
        ("stop 10000 strings", dict(stop=["x"] * 10000), f"{inv}:stop"),
        ("stop string of 257 bytes", dict(stop=["x" * 257]), f"{inv}:stop"),
        ("stop string of 1 MiB", dict(stop=["x" * (1 << 20)]), f"{inv}:stop"),
        ("stop empty string", dict(stop=[""]), f"{inv}:stop"),
        ("stop with NUL and controls", dict(stop=["\x00", "\x1b[", "\u2028"]), ok),
        ("logprobs 0", dict(logprobs=0), ok),
        ("logprobs 20", dict(logprobs=20), ok),
        ("logprobs 21", dict(logprobs=21), f"{inv}:logprobs"),
        ("logprobs -1", dict(logprobs=-1), f"{inv}:logprobs"),
        ("logprobs int32 min", dict(logprobs=I32_MIN), f"{inv}:logprobs"),
    ]
    return c


def random_utf8(rng, n):
    """n random code points (any plane, controls and NUL included, no surrogates)."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            cp = rng.randrange(0, 0x80)
        elif r < 0.8:
            cp = rng.randrange(0x80, 0x800)
        elif r < 0.95:
            cp = rng.choice([rng.randrange(0x800, 0xD800), rng.randrange(0xE000, 0x10000)])
        else:
            cp = rng.randrange(0x10000, 0x110000)
        out.append(chr(cp))
    return "".join(out)


def random_bytes(rng, n):
    return bytes(rng.randrange(256) for _ in range(n))


def mutate(rng, data):
    """A random edit of valid wire bytes (flip, insert, delete, truncate, duplicate)."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if not data:
            data.append(rng.randrange(256))
        i = rng.randrange(len(data))
        if op == 0:
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            data.insert(i, rng.randrange(256))
        elif op == 2:
            del data[i]
        elif op == 3:
            del data[i:]
        else:
            data[i:i] = data[i:i + rng.randint(1, 8)]
    return bytes(data)


def seeded(seed):
    return random.Random(seed)
