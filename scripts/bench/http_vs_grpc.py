#!/usr/bin/python3
"""Short completions through the HTTP API against the gRPC API of one `tandem serve`, side by side.

  scripts/bench/http_vs_grpc.py [--build-dir build] [--concurrency 1,4,16,64,256]
                                [--seconds 4] [--reps 3] [--max-tokens 4] [--json-out FILE]

One server (the bundled stories260k model unless --model), one client harness for both APIs:
C closed-loop clients (threads spread over --procs processes), each sending a greedy completion
of a short prompt (max_tokens --max-tokens) as soon as its previous one ended: gRPC
`Generation.Generate` on one channel per process, HTTP `POST /v1/completions` (not streamed) on
one keep-alive connection per client. For each repetition and concurrency the two APIs run
back to back (alternating which goes first), --seconds each. Reports per cell the median over
repetitions of completions/s, of the p50 and p99 latency and of the server's CPU time per
completion (utime + stime of `tandem serve` over the cell: the client's own cost, which differs
between grpcio and http.client, is not in it), and the median per-repetition ratios HTTP / gRPC. Run with /usr/bin/python3 (Debian's python3-grpcio).
"""
import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
PROMPT = "Once upon a time"


def client_proc(api, address, http_port, clients, seconds, max_tokens, queue):
    import grpc
    from tandem_testlib import load_stubs
    stubs = load_stubs()
    latencies, errors = [], []
    lock = threading.Lock()
    start_gate = threading.Event()
    deadline_box = []

    def grpc_loop():
        stub = stubs.gen_grpc.GenerationStub(channel)
        req = stubs.gen.GenerateRequest(
            text=PROMPT, sampling=stubs.sampling.SamplingParams(temperature=0,
                                                                max_tokens=max_tokens))
        start_gate.wait()
        mine = []
        while time.monotonic() < deadline_box[0]:
            t0 = time.monotonic()
            try:
                for _ in stub.Generate(req, timeout=60):
                    pass
                mine.append(time.monotonic() - t0)
            except grpc.RpcError as e:
                errors.append(str(e.code()))
        with lock:
            latencies.extend(mine)

    def http_loop():
        body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
        start_gate.wait()
        mine = []
        while time.monotonic() < deadline_box[0]:
            t0 = time.monotonic()
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    errors.append(str(r.status))
                else:
                    mine.append(time.monotonic() - t0)
            except (OSError, http.client.HTTPException) as e:
                errors.append(type(e).__name__)
                conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
        conn.close()
        with lock:
            latencies.extend(mine)

    channel = grpc.insecure_channel(address) if api == "grpc" else None
    threads = [threading.Thread(target=grpc_loop if api == "grpc" else http_loop)
               for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    deadline_box.append(time.monotonic() + seconds)
    start_gate.set()
    for t in threads:
        t.join()
    queue.put((latencies, errors))


def server_cpu_seconds(pid):
    """utime + stime of the server process (all threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cell(api, address, http_port, concurrency, procs, seconds, max_tokens, server_pid):
    procs = max(1, min(procs, concurrency))
    queue = multiprocessing.Queue()
    workers = []
    for i in range(procs):
        n = concurrency // procs + (1 if i < concurrency % procs else 0)
        workers.append(multiprocessing.Process(
            target=client_proc, args=(api, address, http_port, n, seconds, max_tokens, queue)))
    for w in workers:
        w.start()
    cpu0 = server_cpu_seconds(server_pid)
    latencies, errors = [], []
    for _ in workers:
        lat, err = queue.get()
        latencies += lat
        errors += err
    cpu = server_cpu_seconds(server_pid) - cpu0
    for w in workers:
        w.join()
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000
    return {"rps": len(latencies) / seconds, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "server_cpu_ms": cpu * 1000 / max(1, len(latencies)), "errors": len(errors)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default="")
    ap.add_argument("--concurrency", default="1,4,16,64,256")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    tmp = tempfile.mkdtemp(prefix="tandem-httpbench-")
    port_file, http_file = os.path.join(tmp, "port"), os.path.join(tmp, "http_port")
    cmd = [os.path.join(args.build_dir, "bin", "tandem"), "serve", "--port", "0", "--port-file",
           port_file, "--http-port", "0", "--http-port-file", http_file, "--kv-cache-memory",
           "256MiB", "--http-max-connections-per-client", "0"]
    if args.model:
        cmd += ["--model", args.model]
    server = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, "serve.log"), "wb"),
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not (os.path.exists(port_file) and os.path.exists(http_file)):
            if server.poll() is not None or time.time() > deadline:
                sys.exit(f"tandem serve did not start: {open(os.path.join(tmp, 'serve.log')).read()}")
            time.sleep(0.1)
        address = f"127.0.0.1:{int(open(port_file).read())}"
        http_port = int(open(http_file).read())
        run_cell("http", address, http_port, 4, 1, 1, args.max_tokens, server.pid)  # warm up
        run_cell("grpc", address, http_port, 4, 1, 1, args.max_tokens, server.pid)
        cells = {}
        for rep in range(args.reps):
            for c in levels:
                order = ("grpc", "http") if rep % 2 == 0 else ("http", "grpc")
                for api in order:
                    r = run_cell(api, address, http_port, c, args.procs, args.seconds,
                                 args.max_tokens, server.pid)
                    cells.setdefault((c, api), []).append(r)
                    print(f"rep {rep} c={c} {api}: {r['rps']:.1f}/s p50 {r['p50_ms']:.1f} ms "
                          f"p99 {r['p99_ms']:.1f} ms server CPU {r['server_cpu_ms']:.2f} ms/req "
                          f"errors {r['errors']}", file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=60)

    med = lambda xs: statistics.median(xs)
    rows, out = [], []
    print("| clients | completions/s gRPC / HTTP | HTTP/gRPC | p50 ms gRPC / HTTP | "
          "p99 ms gRPC / HTTP | server CPU ms per completion gRPC / HTTP | HTTP/gRPC CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for c in levels:
        g, h = cells[(c, "grpc")], cells[(c, "http")]
        ratio_rps = med([hh["rps"] / gg["rps"] for gg, hh in zip(g, h)])
        ratio_p50 = med([hh["p50_ms"] / gg["p50_ms"] for gg, hh in zip(g, h)])
        ratio_cpu = med([hh["server_cpu_ms"] / gg["server_cpu_ms"] for gg, hh in zip(g, h)])
        row = {"clients": c, "grpc": {k: med([x[k] for x in g]) for k in g[0]},
               "http": {k: med([x[k] for x in h]) for k in h[0]},
               "http_over_grpc_rps": ratio_rps, "http_over_grpc_p50": ratio_p50,
               "http_over_grpc_server_cpu": ratio_cpu}
        out.append(row)
        gr, ht = row["grpc"], row["http"]
        print(f"| {c} | {gr['rps']:.0f} / {ht['rps']:.0f} | {ratio_rps:.2f} | "
              f"{gr['p50_ms']:.1f} / {ht['p50_ms']:.1f} | {gr['p99_ms']:.1f} / {ht['p99_ms']:.1f} | "
              f"{gr['server_cpu_ms']:.2f} / {ht['server_cpu_ms']:.2f} | {ratio_cpu:.2f} |")
    if args.json_out:
        json.dump({"command": " ".join(sys.argv), "reps": args.reps, "seconds": args.seconds,
                   "max_tokens": args.max_tokens, "rows": out,
                   "load_average": os.getloadavg()}, open(args.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
