#!/usr/bin/python3
"""`tandem bench` against `tandem serve` (bundled model): a few seconds of closed-loop and
Poisson load with shared prefixes and cancellations; checks the JSON report against what was
asked, and the clear error when no server listens."""
import json
import os
import socket
import subprocess
import sys
import tempfile

from tandem_testlib import Server, check


def bench(build_dir, *args, timeout=120):
    cmd = [os.path.join(build_dir, "bin", "tandem"), "bench"] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    build_dir = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="tandem-bench-smoke-")

    # No server: a clear error, quickly.
    port = free_port()
    out = bench(build_dir, "--target", f"127.0.0.1:{port}", "--connect-timeout", "1",
                "--num-requests", "1", timeout=30)
    check(out.returncode == 1, f"unreachable server: exit {out.returncode}\n{out.stderr}")
    check("cannot reach a Tandem server" in out.stderr, out.stderr)
    print("ok: unreachable server is a clear error")

    with Server(build_dir, "--max-num-seqs", "16") as server:
        report_path = os.path.join(tmp, "closed.json")
        out = bench(build_dir, "--target", server.address, "--num-requests", "24",
                    "--concurrency", "4", "--warmup-requests", "2", "--prompt-len", "uniform:8:48",
                    "--output-len", "lognormal:24:0.5:64", "--shared-prefixes", "2",
                    "--prefix-len", "32", "--cancel-fraction", "0.25", "--sample-interval", "0.01",
                    "--label", "smoke", "--json-out", report_path)
        check(out.returncode == 0, f"bench failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        check("TTFT" in out.stdout and "Throughput" in out.stdout, out.stdout)
        check("[bench]" in out.stderr, f"progress line on stderr: {out.stderr!r}")
        r = json.load(open(report_path))
        req = r["requests"]
        check(r["label"] == "smoke", str(r["label"]))
        check(req["issued"] == 24 and req["failed"] == 0, str(req))
        check(req["completed"] + req["cancelled"] == 24 and req["cut"] == 0, str(req))
        check(req["cancelled"] >= 1, f"a quarter of the requests is cancelled: {req}")
        check(r["config"]["concurrency"] == 4 and r["config"]["num_prefixes"] == 2, str(r["config"]))
        check(r["config"]["vocab_size"] == 512, f"vocab from ListModels: {r['config']}")
        check(r["throughput"]["output_tokens_per_s"] > 0, str(r["throughput"]))
        check(r["throughput"]["requests_per_s"] > 0, str(r["throughput"]))
        for key in ("ttft_ms", "itl_ms", "e2e_ms"):
            s = r[key]
            check(s["count"] > 0 and 0 < s["p50"] <= s["p90"] <= s["p99"] <= s["max"], f"{key}: {s}")
        check(r["e2e_ms"]["count"] == req["completed"], str(r["e2e_ms"]))
        check(r["tokens"]["cached"] > 0, f"shared prefixes hit the prefix cache: {r['tokens']}")
        split = r["server_ttft_split_ms"]
        check(split["requests"] == req["completed"] and split["remote"] == 0, str(split))
        check(split["prefill"]["mean"] > 0, str(split))
        kv = r["kv_waste"]
        check(kv["sampled"]["samples"] > 0 and kv["server"]["samples"] > 0, str(kv))
        check(0 <= kv["steps"]["paged"] < kv["steps"]["static"] <= kv["steps"]["max_len"] < 1, str(kv))
        print(f"ok: closed loop, {req['completed']} completed, {req['cancelled']} cancelled, "
              f"{r['throughput']['output_tokens_per_s']:.0f} tok/s")

        # Poisson arrivals for a fixed duration, fixed lengths: every output has its length.
        report_path = os.path.join(tmp, "poisson.json")
        out = bench(build_dir, "--target", server.address, "--duration", "3",
                    "--request-rate", "4", "--concurrency", "0", "--prompt-len", "16",
                    "--output-len", "8", "--json-out", report_path, "--quiet")
        check(out.returncode == 0, f"bench failed ({out.returncode}):\n{out.stderr}")
        check(out.stdout == "", f"--quiet prints no table: {out.stdout!r}")
        r = json.load(open(report_path))
        req = r["requests"]
        check(2 <= req["issued"] <= 40, f"about 12 requests in 3 s at 4/s: {req}")
        check(req["completed"] == req["issued"], str(req))
        check(r["output_len"]["min"] == 8 and r["output_len"]["max"] == 8, str(r["output_len"]))
        check(r["config"]["request_rate"] == 4, str(r["config"]))
        print(f"ok: Poisson 4 req/s for 3 s issued {req['issued']} requests")
        # --cut-at-end: long requests still running when the duration ends are cancelled.
        report_path = os.path.join(tmp, "cut.json")
        out = bench(build_dir, "--target", server.address, "--duration", "2", "--concurrency", "4",
                    "--prompt-len", "16", "--output-len", "480", "--cut-at-end",
                    "--json-out", report_path, "--quiet", timeout=60)
        check(out.returncode == 0, f"bench failed ({out.returncode}):\n{out.stderr}")
        r = json.load(open(report_path))
        req = r["requests"]
        check(req["cut"] >= 1 and req["failed"] == 0, f"cut at the end, not failed: {req}")
        check(r["duration_s"] < 20, f"cut requests do not run to the end: {r['duration_s']}")
        check(r["throughput"]["output_tokens_per_s_while_issuing"] > 0, str(r["throughput"]))
        print(f"ok: --cut-at-end cut {req['cut']} requests")
        check(server.terminate() == 0, "server exits cleanly")


if __name__ == "__main__":
    main()
