#!/usr/bin/python3
"""Attacks on the KV data path of a `tandem serve --prefill-workers 1 --decode-workers 1` cluster,
each asserting that nothing of the attacker's lands and honest greedy outputs stay
exact. A local process finds a decode worker's KV port by scanning loopback (`ss -ltn`); the test
reads it from the worker's GetInfo.

1. claim (default cluster, no KV flags): an unauthenticated process claims transfers the way
   the issue did: learns the layout from handshake refusals, the incarnation from WELCOME,
   predicts transfer ids from it, learns each transfer's blocks from BEGIN refusals and
   supersedes the real sender with a higher attempt. Not a byte may land.
2. flood (default cluster): many idle connections, handshakes trickled a byte at a time, and
   connections claiming 16 MiB of metadata: the decode worker keeps at most its per-peer
   connection cap open, cuts trickling handshakes at the handshake deadline, its memory and
   threads stay bounded, honest requests meanwhile are exact.
3. unnamed (a cluster with --kv-secret-file, which the attacker holds too): the test acts as the
   router (Decode with remote_prefill on the decode worker, then Prefill on the prefill worker
   with the reservation); an authenticated process that knows the transfer's id, incarnation and
   blocks but was not named for it sends it with a higher attempt first. Not a byte may land
   and the named sender's transfer completes exactly.
4. authenticated flood (same cluster): connections that pass the handshake and claim 16 MiB of
   metadata each: the decode worker's memory stays within its receive budget.

Usage: kv_attack_test.py BUILD_DIR [phase ...] (default: all phases)."""
import concurrent.futures
import os
import random
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.request

import grpc

import kv_wire
from tandem_testlib import Cluster, attempt_target, check, internal_channel, load_stubs

MAX_TOKENS = 10
MIB = 1 << 20
# The decode worker's defaults (kvtransfer/transport.h, ReceiverLimits and handshake_timeout).
PER_PEER_CAP = 32
HANDSHAKE_TIMEOUT_S = 5
MEMORY_BUDGET = 96 * MIB


def metric(port, name, **labels):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
    return total


def proc_status(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


class Target:
    """The cluster under attack: its decode worker's pid, KV port, metrics port, channels."""

    def __init__(self, stubs, cluster, metrics_file):
        self.stubs, self.cluster = stubs, cluster
        children = cluster.children()
        self.decode_pid, decode_port = children["decode"][0]
        self.prefill_port = children["prefill"][0][1]
        self.decode = internal_channel(f"127.0.0.1:{decode_port}")
        self.prefill = internal_channel(f"127.0.0.1:{self.prefill_port}")
        info = stubs.worker_grpc.WorkerStub(self.decode).GetInfo(stubs.worker.InfoRequest(),
                                                                 timeout=10)
        self.kv_port = int(info.kv_endpoint.rsplit(":", 1)[1])
        workers = dict(line.split() for line in open(metrics_file + ".workers").read().splitlines())
        self.decode_metrics = int(workers["decode"].rsplit(":", 1)[1])
        self.gen = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(cluster.address))

    def refused(self, reason):
        return metric(self.decode_metrics, "tandem_kv_transfer_connections_refused_total",
                      direction="receive", reason=reason)


def prompts(seed, n):
    """Token-id prompts of 40..120 tokens (several KV blocks each)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 500) for _ in range(rng.randint(40, 120))] for _ in range(n)]


SALTS = iter(range(1 << 30))


def generate_ids(t, ids):
    """Greedy tokens of prompt `ids` through the router, under a fresh cache salt: no request
    hits another's cached prefix, so every one is prefilled on the prefill worker and its KV
    crosses the data path."""
    request = t.stubs.gen.GenerateRequest(
        sampling=t.stubs.sampling.SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
        cache_salt=f"kv-attack-{os.getpid()}-{next(SALTS)}")
    request.token_ids.ids.extend(ids)
    out = []
    for r in t.gen.Generate(request, timeout=120):
        if r.HasField("chunk"):
            out.extend(r.chunk.token_ids)
    return out


def check_exact(t, batch, reference, what):
    """The batch's greedy outputs, three requests at a time, equal the reference."""
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outputs = list(pool.map(lambda ids: generate_ids(t, ids), batch))
    for got, want in zip(outputs, reference):
        check(got == want, f"{what}: an honest output changed: {got} != {want}")


def learn_layout(port, secret=None):
    """The receiver's layout, learned the way an attacker does: from what its handshake
    refusals disclose. Returns (peer with a WELCOME, layout) or (None, [refusals])."""
    layout, refusals = kv_wire.Layout(), []
    for _ in range(12):
        p = kv_wire.Peer(port)
        try:
            kind, what, challenged = p.handshake(layout, secret)
        except (ConnectionError, OSError) as e:
            p.close()
            refusals.append(f"closed: {e}")
            return None, refusals
        if kind == "welcome":
            return p, layout
        p.close()
        refusals.append(what)
        if not layout.learn(what):
            return None, refusals
    return None, refusals


# ------------------------------------------------------------------------------- 1. claim

def held_attempt(result):
    """Whether a RESULT for an attacker's attempt shows the receiver took the attempt (and so
    its DATA): it completed (OK), or it ended later (cancelled, superseded, incomplete). A
    refusal at BEGIN (unknown, not named, wrong blocks, stale) shows it did not."""
    _, _, code, message = result
    refused = code in ("NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAUTHENTICATED")
    return not refused and "is stale" not in message


class Claimer(threading.Thread):
    """The issue's attack: predictable ids, BEGIN refusals disclosing the blocks, a higher
    attempt superseding the real sender, then the whole transfer with its own first tokens."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.stop = port, threading.Event()
        self.welcomed, self.refusals, self.landed, self.claims, self.error = 0, [], [], 0, None
        self.disclosed = set()  # transfers whose expected blocks a refusal told

    def run(self):
        try:
            self.attack()
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = repr(e)

    def attack(self):
        p, layout = learn_layout(self.port)
        if p is None:
            self.refusals = layout
            return
        self.welcomed += 1
        inc, k, attempt = p.incarnation, 0, 1000
        salt = (inc << 20) & ((1 << 64) - 1)
        while not self.stop.is_set():
            # Probe the next predicted ids at once: a refusal naming the expected block count
            # tells which one is reserved now.
            window = [salt ^ (k + i) for i in range(24)]
            for tid in window:
                attempt += 1
                p.begin(tid, attempt, inc, [])
            found = None
            for tid, _, _, message in p.results(1.0, want=len(window)):
                m = re.search(r"the receiver expects (\d+)", message)
                if m and tid in window and (found is None or window.index(tid) <
                                            window.index(found[0])):
                    found = (tid, int(m.group(1)))
                if m:
                    self.disclosed.add(tid)
            if found is None:
                continue
            tid, n = found
            k += window.index(tid) + 1
            # A refusal names the first wrong position and the block expected there; reserved
            # blocks mostly come in a run, so guess the rest from it and correct on refusal.
            dst = [-1] * n
            for _ in range(n + 1):
                attempt += 1  # higher than the real sender's: it becomes stale
                if -1 not in dst:
                    self.claims += 1
                    _, results = p.land(tid, attempt, inc, dst, kv_wire.first_tokens_trailer([7]))
                    mine = [r for r in results if r[1] == attempt]
                    self.landed += [r for r in mine if held_attempt(r)]
                    if not mine or held_attempt(mine[0]):
                        break
                    got = mine
                else:
                    p.begin(tid, attempt, inc, dst)
                    got = p.results(1.0, want=1)
                m = got and re.search(
                    r"at position (\d+) where the receiver expects block (-?\d+)", got[0][3])
                if not m:
                    break
                i, b = int(m.group(1)), int(m.group(2))
                dst[i:] = [b + j for j in range(n - i)]


def phase_claim(t, batch, reference):
    claimer = Claimer(t.kv_port)
    claimer.start()
    time.sleep(0.3)
    check_exact(t, batch, reference, "claim")
    claimer.stop.set()
    claimer.join(10)
    check(claimer.error is None, f"claim: the attacker failed: {claimer.error}")
    check(not claimer.landed and claimer.welcomed == 0 and not claimer.disclosed,
          f"claim: an unauthenticated process was welcomed ({claimer.welcomed}), learned the "
          f"expected blocks of {len(claimer.disclosed)} transfers from refusals, and held the "
          f"live attempt (its bytes landed) of {len(claimer.landed)} of {claimer.claims} "
          f"claimed transfers: {claimer.landed[:3]}")
    check(claimer.refusals and all("UNAUTHENTICATED" in r for r in claimer.refusals),
          f"claim: the refusals were {claimer.refusals}")
    check(not any("local" in r or "num_" in r or "model" in r for r in claimer.refusals),
          f"claim: a refusal disclosed the layout: {claimer.refusals}")
    check(t.refused("unauthenticated") >= 1, "claim: the decode worker did not count the refusal")
    print(f"ok: claim: an unauthenticated process is refused at the handshake "
          f"({claimer.refusals[0]!r}); {len(batch)} honest outputs exact")


# ------------------------------------------------------------------------------- 2. flood

def is_closed(sock):
    """Whether the receiver closed `sock` (peeks without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Flood:
    """Idle connections, trickled handshakes and connections claiming 16 MiB of metadata
    (after a handshake when the receiver lets them through)."""

    def __init__(self, port, layout, secret, idle, trickle, claims):
        self.port, self.layout, self.secret = port, layout, secret
        self.idle, self.trickle, self.claims = [], [], []
        self.stop = threading.Event()
        self.claimed = 0
        self.hello = frame_hello(layout)
        for _ in range(idle):
            self.idle.append(self.connect())
        for _ in range(trickle):
            self.trickle.append(self.connect())
        self.trickler = threading.Thread(target=self.trickle_loop, daemon=True)
        self.trickler.start()
        for _ in range(claims):
            self.claim()

    def connect(self):
        try:
            return socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return None

    def claim(self):
        p = None
        try:
            p = kv_wire.Peer(self.port)
            kind, _, _ = p.handshake(self.layout, self.secret)
            if kind != "welcome":
                p.close()
                return
            # A BEGIN whose metadata claims 16 MiB, then a trickle of it.
            p.sock.sendall(struct.pack("<IHHII", kv_wire.FRAME_MAGIC, kv_wire.BEGIN, 0, 16 * MIB,
                                       0) + b"\0" * 4096)
            self.claims.append(p.sock)
            self.claimed += 1
        except (OSError, ConnectionError):
            if p is not None:
                p.close()

    def trickle_loop(self):
        i = 0
        while not self.stop.is_set() and i < len(self.hello):
            for s in self.trickle + self.claims:
                if s is not None:
                    try:
                        s.send(self.hello[i:i + 1] if s in self.trickle else b"\0" * 64)
                    except OSError:
                        pass
            i += 1
            self.stop.wait(0.25)

    def open_count(self, socks):
        return sum(1 for s in socks if s is not None and not is_closed(s))

    def close(self):
        self.stop.set()
        self.trickler.join(5)
        for s in self.idle + self.trickle + self.claims:
            if s is not None:
                s.close()


def frame_hello(layout):
    return kv_wire.frame(kv_wire.HELLO, struct.pack("<I", kv_wire.HELLO_MAGIC) + layout.encode())


def watch_memory(pid, stop, peak):
    while not stop.is_set():
        peak["rss"] = max(peak["rss"], proc_status(pid, "VmRSS") * 1024)
        peak["threads"] = max(peak["threads"], proc_status(pid, "Threads"))
        stop.wait(0.05)


def flood_round(t, batch, reference, layout, secret, what, idle, trickle, claims, memory_bound):
    rss0 = proc_status(t.decode_pid, "VmRSS") * 1024
    threads0 = proc_status(t.decode_pid, "Threads")
    peak, stop = {"rss": rss0, "threads": threads0}, threading.Event()
    watcher = threading.Thread(target=watch_memory, args=(t.decode_pid, stop, peak), daemon=True)
    watcher.start()
    started = time.time()
    flood = Flood(t.kv_port, layout, secret, idle, trickle, claims)
    try:
        time.sleep(1.0)
        open_now = flood.open_count(flood.idle + flood.trickle + flood.claims)
        check_exact(t, batch, reference, what)
        # Past the handshake deadline every trickled handshake is cut.
        time.sleep(max(0.0, started + HANDSHAKE_TIMEOUT_S + 2 - time.time()))
        trickling = flood.open_count(flood.trickle)
    finally:
        flood.close()
        stop.set()
        watcher.join(5)
    grown = peak["rss"] - rss0
    print(f"{what}: {idle + trickle + claims} connections ({flood.claimed} claiming 16 MiB), "
          f"{open_now} kept open, {trickling} trickling after {HANDSHAKE_TIMEOUT_S + 2} s, "
          f"memory +{grown / MIB:.1f} MiB, threads +{peak['threads'] - threads0}")
    check(open_now <= PER_PEER_CAP, f"{what}: the decode worker kept {open_now} connections "
          f"from one address open (cap {PER_PEER_CAP})")
    check(trickling == 0, f"{what}: {trickling} trickled handshakes outlived the deadline")
    check(grown <= memory_bound, f"{what}: the decode worker grew by {grown / MIB:.1f} MiB "
          f"(bound {memory_bound / MIB:.0f} MiB)")
    check(peak["threads"] - threads0 <= PER_PEER_CAP + 8,
          f"{what}: the decode worker started {peak['threads'] - threads0} threads")
    return flood.claimed


def phase_flood(t, batch, reference):
    p, layout = learn_layout(t.kv_port)
    if p is not None:  # let through (no secret): the claims below get as far as it allows
        p.close()
    else:
        layout = kv_wire.Layout(protocol_version=3)
    flood_round(t, batch, reference, layout, None, "flood", idle=150, trickle=16, claims=40,
                memory_bound=64 * MIB)
    check(t.refused("peer_connection_limit") >= 1, "flood: no connection refused for the cap")
    check(t.refused("handshake_timeout") >= 1, "flood: no handshake cut at its deadline")
    print("ok: flood: connections capped, trickled handshakes cut, memory bounded, outputs exact")


# ------------------------------------------------------------------------------- 3. unnamed

def phase_unnamed(t, batch, reference, secret):
    p, layout = learn_layout(t.kv_port, secret)
    check(p is not None, f"unnamed: the attacker holding the secret was refused: {layout}")
    p.close()
    sampling = t.stubs.sampling.SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    decode = t.stubs.worker_grpc.WorkerStub(t.decode)
    prefill = t.stubs.worker_grpc.WorkerStub(t.prefill)
    for i, (ids, want) in enumerate(zip(batch, reference)):
        request_id = f"kv-attack-unnamed-{i}-{os.getpid()}"
        stream = decode.Decode(t.stubs.worker.DecodeRequest(
            request_id=request_id, prompt_token_ids=ids, sampling=sampling, n=1,
            remote_prefill=True, kv_lease_ms=30000, cache_salt=request_id), timeout=60)
        first = next(stream)
        check(first.HasField("reservation"), f"unnamed: no reservation first: {first}")
        r = first.reservation
        # Everything the router knows but the transfer's key: id, incarnation, blocks.
        attacker = kv_wire.Peer(t.kv_port)
        kind, _, _ = attacker.handshake(layout, secret)
        check(kind == "welcome", "unnamed: the authenticated attacker was not welcomed")
        sent, results = attacker.land(r.transfer_id, 5, r.incarnation, list(r.dst_blocks),
                                      kv_wire.first_tokens_trailer([7]))
        attacker.close()
        landed = [x for x in results if held_attempt(x)]
        check(not landed, f"unnamed: an authenticated sender the router did not name landed "
              f"transfer {r.transfer_id}: {results}")
        check(results and all(x[2] == "NOT_FOUND" for x in results),
              f"unnamed: the refusals were {results}")
        check(not any("expects" in x[3] or "block" in x[3] or "live attempt" in x[3]
                      for x in results),
              f"unnamed: a refusal disclosed the expectation: {results}")
        prefill.Prefill(t.stubs.worker.PrefillRequest(
            request_id=request_id, prompt_token_ids=ids, sampling=sampling, n=1,
            target=attempt_target(r, 0), attempt=0, cache_salt=request_id), timeout=60)
        got = []
        for m in stream:
            if m.HasField("tokens"):
                got.extend(m.tokens.token_ids)
        check(got == want, f"unnamed: the named sender's output changed: {got} != {want}")
    print(f"ok: unnamed: an authenticated sender not named for {len(batch)} transfers (id, "
          f"blocks, higher attempt) landed nothing; the named sender's outputs are exact")
    return layout


def phase_auth_flood(t, batch, reference, layout, secret):
    claimed = flood_round(t, batch, reference, layout, secret, "authenticated flood", idle=0,
                          trickle=0, claims=64, memory_bound=MEMORY_BUDGET + 48 * MIB)
    check(claimed >= 1, "authenticated flood: no claim got through the handshake")
    check(t.refused("memory") >= 1, "authenticated flood: no connection cut for memory")
    print("ok: authenticated flood: the decode worker's memory stayed within its budget")


def main():
    build_dir = sys.argv[1]
    phases = set(sys.argv[2:]) or {"claim", "flood", "unnamed", "auth_flood"}
    stubs = load_stubs()
    d = tempfile.mkdtemp(prefix="tandem-kv-attack-")
    batch = prompts(41, 6)
    if phases & {"claim", "flood"}:
        metrics_file = os.path.join(d, "a.metrics")
        with Cluster(build_dir, 1, 1, "--disagg-min-uncached-tokens", "0", "--metrics-port=-1",
                     f"--metrics-port-file={metrics_file}") as cluster:
            t = Target(stubs, cluster, metrics_file)
            reference = [generate_ids(t, ids) for ids in batch]
            if "claim" in phases:
                phase_claim(t, batch, reference)
            if "flood" in phases:
                phase_flood(t, batch[:3], reference[:3])
    if phases & {"unnamed", "auth_flood"}:
        secret = os.urandom(24).hex().encode()
        secret_file = os.path.join(d, "kv.secret")
        with open(secret_file, "wb") as f:
            f.write(secret + b"\n")
        os.chmod(secret_file, 0o600)
        metrics_file = os.path.join(d, "b.metrics")
        with Cluster(build_dir, 1, 1, "--kv-secret-file", secret_file,
                     "--disagg-min-uncached-tokens", "0", "--metrics-port=-1",
                     f"--metrics-port-file={metrics_file}") as cluster:
            t = Target(stubs, cluster, metrics_file)
            reference = [generate_ids(t, ids) for ids in batch[:3]]
            layout = kv_wire.Layout()
            if "unnamed" in phases:
                layout = phase_unnamed(t, batch[:3], reference, secret)
            else:
                p, layout = learn_layout(t.kv_port, secret)
                p.close()
            if "auth_flood" in phases:
                phase_auth_flood(t, batch[:3], reference, layout, secret)
    print("PASS")


if __name__ == "__main__":
    main()
