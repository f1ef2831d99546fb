"""A hostile peer of a decode worker's KV port (kvtransfer/README.md, "TCP wire protocol"),
written from the protocol's description for the attack tests: frames, the handshake (with or
without the shared secret), BEGIN / DATA / FINISH, RESULTs. It speaks whatever protocol version
the receiver names (a BEGIN carries a proof field from version 3 on)."""
import hashlib
import hmac
import os
import re
import socket
import struct
import time

FRAME_MAGIC = 0x46564B54  # "TKVF"
HELLO_MAGIC = 0x4D444E54  # "TNDM"
HELLO, WELCOME, REFUSE, BEGIN, DATA, FINISH, ABORT, RESULT, CHALLENGE, AUTH = range(1, 11)
SENDER_LABEL = b"tandem kvtransfer v2 sender proof"
DTYPES = {"f32": 0, "bf16": 1, "f16": 2, "i8": 3, "u8": 4, "i32": 5, "i64": 6, "f8e4m3": 7}
DTYPE_SIZE = {0: 4, 1: 2, 2: 2, 3: 1, 4: 1, 5: 4, 6: 8, 7: 1}
CODES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
         5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
         9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
         13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def s(b):
    return struct.pack("<I", len(b)) + b


def blocks(ids):
    return struct.pack("<I", len(ids)) + b"".join(struct.pack("<i", i) for i in ids)


def frame(kind, meta, flags=0):
    return struct.pack("<IHHII", FRAME_MAGIC, kind, flags, len(meta), crc32c(meta)) + meta


class Layout:
    def __init__(self, protocol_version=2, model_id=b"?", num_layers=1, num_kv_heads=1,
                 head_dim=1, block_size=1, kv_dtype=0):
        self.protocol_version, self.model_id = protocol_version, model_id
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size, self.kv_dtype = block_size, kv_dtype

    def encode(self):
        return (struct.pack("<I", self.protocol_version) + s(self.model_id) +
                struct.pack("<qqqqB", self.num_layers, self.num_kv_heads, self.head_dim,
                            self.block_size, self.kv_dtype))

    def region_bytes(self):
        rows = 2 * self.num_kv_heads * self.block_size
        return rows * self.head_dim * DTYPE_SIZE[self.kv_dtype] + (
            rows * 4 if self.kv_dtype in (3, 7) else 0)

    def learn(self, refusal):
        """Takes the value a refusal "kv layout mismatch in F: local V, peer W" disclosed;
        False when the refusal disclosed nothing."""
        m = re.search(r"kv layout mismatch in (\w+): local (.*), peer ", refusal)
        if not m:
            return False
        field, value = m.group(1), m.group(2)
        if field == "model_id":
            self.model_id = value.strip("'").encode()
        elif field == "kv_dtype":
            self.kv_dtype = DTYPES[value]
        else:
            setattr(self, field, int(value))
        return True


def decode_layout(meta, pos):
    (version,) = struct.unpack_from("<I", meta, pos)
    pos += 4
    (n,) = struct.unpack_from("<I", meta, pos)
    model = meta[pos + 4:pos + 4 + n]
    pos += 4 + n
    layers, heads, dim, bs, dtype = struct.unpack_from("<qqqqB", meta, pos)
    return Layout(version, model, layers, heads, dim, bs, dtype), pos + 33


def decode_outcome(meta):
    tid, attempt, code, n = struct.unpack_from("<QIII", meta, 0)
    return tid, attempt, CODES.get(code, str(code)), meta[20:20 + n].decode("utf-8", "replace")


class Peer:
    """One connection to a KV port."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.incarnation, self.layout, self.nonces = None, None, b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, kind, meta, flags=0, payload=b""):
        self.sock.sendall(frame(kind, meta, flags) + payload)

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the receiver")
            out += chunk
        return out

    def recv(self, timeout=None):
        """(type, metadata) of the next message; socket.timeout when none came."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        magic, kind, _, n, _ = struct.unpack("<IHHII", self._read(16))
        if magic != FRAME_MAGIC:
            raise ConnectionError("bad magic from the receiver")
        return kind, self._read(n)

    def handshake(self, layout, secret=None):
        """HELLO [-> CHALLENGE -> AUTH] -> WELCOME | REFUSE. Returns ("welcome", layout),
        ("refuse", "CODE message") or ("challenge", None) when challenged without a secret
        (the AUTH then carries a made-up proof, and the answer is returned as well)."""
        hello = struct.pack("<I", HELLO_MAGIC) + layout.encode()
        self.send(HELLO, hello)
        kind, meta = self.recv()
        challenged = False
        if kind == CHALLENGE:
            challenged = True
            (n,) = struct.unpack_from("<I", meta, 0)
            receiver_nonce = meta[4:4 + n]
            sender_nonce = os.urandom(32)
            if secret is not None:
                parts = [SENDER_LABEL, receiver_nonce, sender_nonce, hello]
                proof = hmac.new(secret, b"".join(s(p) for p in parts), hashlib.sha256).digest()
            else:
                proof = os.urandom(32)  # a guess
            self.nonces = receiver_nonce + sender_nonce
            self.send(AUTH, s(sender_nonce) + s(proof))
            kind, meta = self.recv()
        if kind == REFUSE:
            _, _, code, message = decode_outcome(meta)
            return ("refuse", f"{code} {message}", challenged)
        if kind == WELCOME:
            (self.incarnation,) = struct.unpack_from("<Q", meta, 0)
            self.layout, _ = decode_layout(meta, 8)
            return ("welcome", self.layout, challenged)
        raise ConnectionError(f"unexpected answer {kind} to HELLO")

    def begin(self, transfer_id, attempt, incarnation, dst, proof=b""):
        meta = (struct.pack("<QIQq", transfer_id, attempt, incarnation, -1) + blocks(dst))
        if self.layout is not None and self.layout.protocol_version >= 3:
            meta += s(proof)
        self.send(BEGIN, meta)

    def data(self, transfer_id, attempt, layer, dst, fill=0x41):
        """A DATA message over `dst` without a payload checksum (the flag is the sender's
        choice): as fast as the wire goes."""
        n = len(dst) * self.layout.region_bytes()
        meta = struct.pack("<QIIQ", transfer_id, attempt, layer, n) + blocks(dst)
        self.send(DATA, meta, flags=0, payload=bytes([fill]) * n)
        return n

    def finish(self, transfer_id, attempt, frames, nbytes, trailer):
        self.send(FINISH, struct.pack("<QIQQ", transfer_id, attempt, frames, nbytes) + s(trailer))

    def results(self, timeout, want=None):
        """The RESULTs that arrive within `timeout` s (or the first `want` of them):
        [(id, attempt, code, message)]."""
        out, end = [], time.time() + timeout
        while True:
            left = end - time.time()
            if left <= 0 or (want is not None and len(out) >= want):
                return out
            try:
                kind, meta = self.recv(timeout=left)
            except (socket.timeout, TimeoutError):
                return out
            if kind == RESULT:
                out.append(decode_outcome(meta))

    def land(self, transfer_id, attempt, incarnation, dst, trailer, proof=b""):
        """BEGIN, a DATA message per layer over every block of `dst` and FINISH: the whole
        of a transfer. Returns (bytes sent, the RESULTs that came back until the one for this
        attempt, within 2 s)."""
        self.begin(transfer_id, attempt, incarnation, dst, proof)
        sent = 0
        for layer in range(self.layout.num_layers):
            sent += self.data(transfer_id, attempt, layer, dst)
        self.finish(transfer_id, attempt, self.layout.num_layers, sent, trailer)
        out, end = [], time.time() + 2.0
        while time.time() < end:
            got = self.results(end - time.time(), want=1)
            out += got
            if not got or any(r[0] == transfer_id and r[1] == attempt for r in got):
                break
        return sent, out


def first_tokens_trailer(token_ids):
    """A tandem.v1.FirstTokens message (field 1: packed int32 token ids)."""
    packed = b""
    for t in token_ids:
        v = t
        while True:
            b = v & 0x7F
            v >>= 7
            packed += bytes([b | (0x80 if v else 0)])
            if not v:
                break
    return b"\x0a" + bytes([len(packed)]) + packed
