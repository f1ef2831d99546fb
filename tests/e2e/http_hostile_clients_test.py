#!/usr/bin/python3
"""The HTTP API under hostile and slow clients, all at once on loopback: slowloris connections
(partial headers, a byte now and then), slow bodies (1 byte/s), streaming clients that stop
reading, and idle keep-alives, each reconnecting as soon as the server drops it (as an attacker
would). Meanwhile a well-behaved client's completions succeed with a p99 latency within 2x of
the idle server's, the server's RSS stays bounded, every hostile connection is closed within its
timeout (short timeouts by flag keep this quick), and the abandoned streams' generations are
cancelled with their KV blocks freed (the worker's stats return to idle)."""
import asyncio
import http.client
import json
import multiprocessing
import os
import socket
import sys
import time
import urllib.request

from http_api_test import HttpServer
from tandem_testlib import check, load_stubs, serve_stats

import grpc

SLOWLORIS, SLOW_BODY, STALLED_SSE, IDLE = 500, 200, 100, 200
HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, WRITE_TIMEOUT = 3.0, 3.0, 4.0, 2.0
# How late a close may come on a loaded 2-core machine (the event loop, the Python client's own
# scheduling): generous, yet far below what an unbounded server would show (never).
SLACK = 4.0
ATTACK_SECONDS = 12
PROMPT = "Once upon a time"


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tandem_http_") or line.startswith("tandem_router_requests_total"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def completion_latencies(port, count):
    """A well-behaved client: `count` short completions, one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    out = []
    for _ in range(count):
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        out.append(time.monotonic() - t0)
        check(r.status == 200, f"well-behaved completion: {r.status} {data[:200]!r}")
        check(json.loads(data)["usage"]["completion_tokens"] == 4, "four tokens")
    conn.close()
    return out


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def start_stalled_streams(port):
    """Streams whose clients never read (a 4 KiB receive buffer); returns their sockets."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": 480, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    stalled = []
    for _ in range(STALLED_SSE):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(req)
        stalled.append(s)  # never read until the end
    return stalled


class Attack:
    """The hostile clients on one asyncio loop (a thread); records how long each took to close."""

    def __init__(self, port, stop):
        self.port = port
        self.stop_event = stop
        self.stop = False
        self.closes = {"slowloris": [], "slow_body": [], "idle": []}
        self.open = {k: 0 for k in ("slowloris", "slow_body", "idle")}
        self.peak_open = 0
        self.errors = []

    async def _connect(self):
        return await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 16)

    async def _wait_closed(self, reader):
        try:
            while await reader.read(4096):
                pass
        except (ConnectionError, OSError):
            pass

    async def _cycle(self, kind):
        while not self.stop:
            try:
                reader, writer = await self._connect()
            except OSError as e:
                self.errors.append(f"{kind} connect: {e}")
                await asyncio.sleep(0.2)
                continue
            self.open[kind] += 1
            self.peak_open = max(self.peak_open, sum(self.open.values()))
            try:
                if kind == "slowloris":
                    start = time.monotonic()
                    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "

                    async def trickle():
                        writer.write(head)
                        while True:
                            await asyncio.sleep(2.0)
                            writer.write(b"a")
                    limit = HEADER_TIMEOUT
                elif kind == "slow_body":
                    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                 b"application/json\r\nContent-Length: 1000\r\n\r\n")
                    await writer.drain()
                    start = time.monotonic()

                    async def trickle():
                        while True:
                            writer.write(b" ")
                            await asyncio.sleep(1.0)
                    limit = BODY_TIMEOUT
                else:  # idle keep-alive: one request, then silence
                    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    got = b""
                    while b"ok\n" not in got:
                        chunk = await reader.read(4096)
                        if not chunk:
                            raise ConnectionError("closed before the response")
                        got += chunk
                    start = time.monotonic()

                    async def trickle():
                        await asyncio.sleep(3600)
                    limit = IDLE_TIMEOUT
                task = asyncio.ensure_future(trickle())
                await self._wait_closed(reader)
                task.cancel()
                took = time.monotonic() - start
                self.closes[kind].append((took, limit))
            except (ConnectionError, OSError) as e:
                self.errors.append(f"{kind}: {e}")
            finally:
                self.open[kind] -= 1
                writer.close()


    async def _watch(self):
        while not self.stop_event.is_set():
            await asyncio.sleep(0.1)
        self.open_at_stop = dict(self.open)
        self.stop = True

    def run(self, results):
        """In its own process (so the attack's Python does not hold the client's GIL)."""
        self.loop = asyncio.new_event_loop()
        tasks = [self.loop.create_task(self._cycle(kind)) for kind, n in
                 (("slowloris", SLOWLORIS), ("slow_body", SLOW_BODY), ("idle", IDLE))
                 for _ in range(n)]
        tasks.append(self.loop.create_task(self._watch()))
        self.loop.run_until_complete(asyncio.wait(tasks))
        self.loop.close()
        results.put({"closes": self.closes, "peak_open": self.peak_open,
                     "errors": self.errors, "open_at_stop": self.open_at_stop})


def raw_exchange(port, data, timeout=10):
    """Sends raw bytes, returns everything the server sent until it closed or went quiet."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    got = b""
    try:
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionError):
        pass
    s.close()
    return got


def error_of(response):
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)["error"]["message"]


def check_limits(build_dir):
    """Each size and count limit refuses with its own status and message, and says which."""
    with HttpServer(build_dir, "--http-max-header-bytes", "4096", "--http-max-headers", "20",
                    "--http-max-connections-per-client", "8",
                    "--http-max-requests-per-connection", "3") as server:
        port = server.http_port
        big = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"
        status, message = error_of(raw_exchange(port, big))
        check(status == 431 and "headers are too large" in message, f"{status} {message}")
        many = b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(30))
        status, message = error_of(raw_exchange(port, many + b"\r\n"))
        check(status == 431 and "too many request headers" in message, f"{status} {message}")
        # A 200 KB body of nested brackets is refused for its depth, not its size; a body over
        # the size limit for its size.
        nested = b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" %
               len(nested)) + nested
        status, message = error_of(raw_exchange(port, req))
        check(status == 400 and "nests deeper than" in message, f"{status} {message}")
        huge = b"x" * (5 << 20)
        status, message = error_of(raw_exchange(
            port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" %
            len(huge) + huge))
        check(status == 413 and "body is too large (more than 4194304 bytes)" in message,
              f"{status} {message}")
        print("ok: 431 for large or many headers, 400 for nesting, 413 for size, each saying so")

        # Expect: 100-continue, then the body.
        body = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        check(s.recv(100).startswith(b"HTTP/1.1 100 Continue"), "100 Continue")
        s.sendall(body)
        check(b"HTTP/1.1 200" in s.recv(1 << 16), "then 200")
        s.close()

        # The third request on a connection is its last.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(3):
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            check(r.status == 200, "health")
            check((r.getheader("Connection") == "close") == (i == 2), f"request {i}: {r.headers}")
        conn.close()

        # Eight connections from one address; the ninth is closed at once.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            refused = extra.recv(100) == b""
        except ConnectionError:
            refused = True
        check(refused, "a ninth connection from one address is refused")
        for s in held:
            s.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            got = raw_exchange(port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
            if b"200 OK" in got:
                break
            time.sleep(0.1)
        check(b"200 OK" in got, f"served again once they closed: {got!r}")
        print("ok: Expect 100-continue, requests per connection, connections per client")


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    check_limits(build_dir)
    tmp_metrics = f"/tmp/tandem-hostile-metrics-{os.getpid()}"
    with HttpServer(build_dir, "--http-header-timeout", str(HEADER_TIMEOUT),
                    "--http-body-timeout", str(BODY_TIMEOUT), "--http-body-min-rate", "100",
                    "--http-idle-timeout", str(IDLE_TIMEOUT),
                    "--http-write-timeout", str(WRITE_TIMEOUT),
                    "--http-max-buffered-bytes", "16384",
                    "--http-max-connections-per-client", "4000",
                    # Room in the batch for the stalled streams and the well-behaved client:
                    # what is measured is the HTTP front, not the engine's admission queue.
                    "--max-num-seqs", "128",
                    "--metrics-port=-1", f"--metrics-port-file={tmp_metrics}") as server:
        port = server.http_port
        metrics_port = int(open(tmp_metrics).read())
        os.unlink(tmp_metrics)
        channel = grpc.insecure_channel(server.address)
        pid = server.proc.pid

        completion_latencies(port, 5)  # warm up
        idle = completion_latencies(port, 300)
        rss_before = rss_kb(pid)
        m0 = metrics(port=metrics_port)
        print(f"idle server before: p50 {sorted(idle)[len(idle) // 2] * 1000:.1f} p99 {p99(idle) * 1000:.1f} ms, RSS {rss_before // 1024} MiB")

        stop = multiprocessing.Event()
        results = multiprocessing.Queue()
        attacker = multiprocessing.Process(target=Attack(port, stop).run, args=(results,),
                                           daemon=True)
        attacker.start()
        stalled = start_stalled_streams(port)
        time.sleep(1.0)  # let every hostile connection open
        rss_peak = rss_before
        # Phase 1: the stalled streams' generations share the engine's batch with the
        # well-behaved client (engine time, reported); phase 2, once they are cut and cancelled:
        # the other 900 hostile connections stay open (reconnecting) while its p99 is measured.
        shared, busy, cut_at = [], [], None
        t_start = time.monotonic()
        while cut_at is None or time.monotonic() < cut_at + ATTACK_SECONDS:
            check(time.monotonic() < t_start + 60, "the stalled streams were cut within 60 s")
            lat = completion_latencies(port, 5)
            (shared if cut_at is None else busy).extend(lat)
            rss_peak = max(rss_peak, rss_kb(pid))
            if cut_at is None:
                m = metrics(metrics_port)
                cut = sum(m.get(f'tandem_http_timeouts_total{{kind="{k}"}}', 0) -
                          m0.get(f'tandem_http_timeouts_total{{kind="{k}"}}', 0)
                          for k in ("write", "buffer_overflow"))
                if cut >= STALLED_SSE and serve_stats(stubs, channel).running == 0:
                    cut_at = time.monotonic()
                    print(f"stalled streams cut and cancelled after {cut_at - t_start:.1f} s; "
                          f"meanwhile {len(shared)} completions, p99 {p99(shared) * 1000:.1f} ms "
                          f"(sharing the engine's batch with their generations)")
        stop.set()
        attack = results.get(timeout=60)
        attacker.join(timeout=30)
        # The idle baseline once more, after the attack, against drift in the machine's load.
        idle += completion_latencies(port, 300)
        print(f"under attack: {len(busy)} completions, p99 {p99(busy) * 1000:.1f} ms "
              f"({p99(busy) / p99(idle):.2f}x the idle p99 before and after, "
              f"{p99(idle) * 1000:.1f} ms); hostile connections open at the end "
              f"{attack['open_at_stop']}, peak {attack['peak_open']}; RSS peak {rss_peak // 1024} MiB "
              f"(+{(rss_peak - rss_before) // 1024} MiB)")
        check(attack["peak_open"] >= (SLOWLORIS + SLOW_BODY + IDLE) * 0.9,
              f"the hostile connections were open at once: peak {attack['peak_open']}")
        # 2x, with 10 ms of scheduling noise allowed: the attacking process shares the
        # machine's cores with the server.
        check(p99(busy) <= 2 * p99(idle) + 0.010,
              f"p99 under attack {p99(busy):.3f} s within 2x of idle {p99(idle):.3f} s")
        # Bound from the limits: 100 stalled streams x 16 KiB of queued output, 1000 parsers
        # of at most 16 KiB of headers, with the allocator's slack on top.
        check(rss_peak - rss_before < 96 * 1024,
              f"RSS grew {(rss_peak - rss_before) // 1024} MiB")

        # Every hostile connection was closed within its timeout.
        check(not attacker.is_alive(), "the hostile clients ended")
        for kind, closes in attack["closes"].items():
            check(len(closes) > 0, f"{kind}: some connections closed")
            late = [t for t, limit in closes if t > limit + SLACK]
            worst = max(t for t, _ in closes)
            check(not late, f"{kind}: {len(late)} of {len(closes)} closed late (worst {worst:.1f} s)")
            print(f"ok: {len(closes)} {kind} connections closed by the server, "
                  f"worst {worst:.1f} s (timeout {closes[0][1]} s)")
        check(len(attack["errors"]) < 20, f"client errors: {attack['errors'][:5]}")

        # The stalled streams were cut and their generations cancelled: the worker is idle.
        deadline = time.time() + 30
        while time.time() < deadline:
            stats = serve_stats(stubs, channel)
            if stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0:
                break
            time.sleep(0.2)
        check(stats.running == 0 and stats.kv_blocks_used == 0, f"back to idle: {stats}")
        m1 = metrics(port=metrics_port)

        def delta(name):
            return m1.get(name, 0) - m0.get(name, 0)
        cut = (delta('tandem_http_timeouts_total{kind="write"}') +
               delta('tandem_http_timeouts_total{kind="buffer_overflow"}'))
        cancelled = sum(v - m0.get(k, 0) for k, v in m1.items()
                        if k.startswith("tandem_router_requests_total") and 'outcome="cancelled"' in k)
        check(cut >= STALLED_SSE, f"{cut} stalled streams cut (write timeout or buffer)")
        check(cancelled >= STALLED_SSE, f"{cancelled} requests cancelled")
        for s in stalled:
            s.settimeout(10)
            try:
                while s.recv(1 << 16):
                    pass
            except OSError:
                pass  # a reset: closed too
            s.close()
        for kind in ("header", "body", "idle"):
            check(delta(f'tandem_http_timeouts_total{{kind="{kind}"}}') > 0, f"{kind} timeouts")
        check(m1["tandem_http_connections_open"] <= 2, f"open now {m1['tandem_http_connections_open']}")
        print(f"ok: {STALLED_SSE} streams that stopped reading were cut ({cut:.0f}) and "
              f"cancelled ({cancelled:.0f}); worker idle: {stats.running} running, "
              f"{stats.kv_blocks_used} KV blocks")
        check(completion_latencies(port, 3), "still serving")
    print("PASS")


if __name__ == "__main__":
    main()
