#!/usr/bin/python3
"""KV cache tiers (--kv-offload-host-memory, --kv-offload-dir) through `tandem serve` over HTTP.

Interleaved multi-turn sessions on a pool far smaller than their working set: the outputs are
bit-identical with the tiers on and off, and with them on later turns report their history as
cached (loaded back from the tiers) where the pool alone has lost it. Then SIGTERM and a restart on
the same directory: the first request of a known session reports cached tokens
(usage.prompt_tokens_details.cached_tokens) and gives the same output. The same in a local cluster
(--prefill-workers 1 --decode-workers 1), where each worker keeps its own DIR/<role>-<index>."""
import http.client
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

from tandem_testlib import Cluster, Server, check

SESSIONS, TURNS = 8, 4
SYSTEM, USER, ANSWER = 64, 32, 32  # tokens per session start, user turn, assistant turn
# 48 blocks of 16 tokens: a session's longest history (321 tokens, 20 blocks) fits, and so do the
# 18 blocks a load of it pins (at most half the pool: KvTierOptions::max_pinned_fraction); the
# eight sessions' histories (160 blocks) do not, so a session's next turn finds its history
# evicted from the pool by the seven others.
POOL = ["--num-kv-blocks", "48", "--block-size", "16"]


class HttpMixin:
    def start_http(self):
        deadline = time.time() + 60
        while not os.path.exists(self.http_port_file):
            check(time.time() < deadline and self.proc.poll() is None,
                  f"no HTTP port:\n{self.logs()}")
            time.sleep(0.05)
        self.http_port = int(open(self.http_port_file).read())


def http_args(tmp):
    return ["--http-port", "0", "--http-port-file", os.path.join(tmp, "http_port")]


class HttpServer(Server, HttpMixin):
    def __init__(self, build_dir, *args, **kw):
        self.http_tmp = tempfile.mkdtemp(prefix="tandem-http-")
        self.http_port_file = os.path.join(self.http_tmp, "http_port")
        super().__init__(build_dir, *http_args(self.http_tmp), *args, **kw)
        self.start_http()


class HttpCluster(Cluster, HttpMixin):
    def __init__(self, build_dir, *args, **kw):
        self.http_tmp = tempfile.mkdtemp(prefix="tandem-http-")
        self.http_port_file = os.path.join(self.http_tmp, "http_port")
        super().__init__(build_dir, 1, 1, *http_args(self.http_tmp), *args, **kw)
        self.start_http()


def complete(server, prompt):
    """(token ids of the greedy completion, cached prompt tokens) over /v1/completions
    (return_token_ids: the ids, as vLLM returns them)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    body = {"prompt": prompt, "max_tokens": ANSWER, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    check(r.status == 200, f"status {r.status}: {data[:300]!r}\n{server.logs()[-3000:]}")
    out = json.loads(data)
    choice = out["choices"][0]
    details = out["usage"].get("prompt_tokens_details") or {}
    return choice["token_ids"], details.get("cached_tokens", 0)


def session_tokens(s, turn):
    """Deterministic token ids: the session's start, then one user turn."""
    n = SYSTEM if turn < 0 else USER
    base = 1000 * s + 100 * (turn + 1)
    return [(base * 7 + 13 * i + s) % 500 + 3 for i in range(n)]


def run_sessions(server):
    """Interleaved sessions (turn t of every session, then turn t+1); each turn's prompt is the
    session's history (earlier prompts and answers) plus new user tokens. Returns
    ({(s, t): answer ids}, {(s, t): cached tokens}, {s: history})."""
    history = {s: [1] + session_tokens(s, -1) for s in range(SESSIONS)}
    answers, cached = {}, {}
    for t in range(TURNS):
        for s in range(SESSIONS):
            history[s] = history[s] + session_tokens(s, t)
            ids, c = complete(server, history[s])
            answers[(s, t)], cached[(s, t)] = ids, c
            history[s] = history[s] + ids
    return answers, cached, history


def metric_sum(port, name, label=None):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (label is None or label in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    build_dir = sys.argv[1]
    work = tempfile.mkdtemp(prefix="tandem-kv-tiers-")
    try:
        with HttpServer(build_dir, *POOL) as off:
            ref, ref_cached, history = run_sessions(off)
        later = [(s, t) for s in range(SESSIONS) for t in range(1, TURNS)]
        pool_only = sum(ref_cached[k] for k in later)
        print(f"tiers off: {pool_only} cached prompt tokens over turns 2-{TURNS}")

        # Monolithic: a host tier (about 100 blocks of 20 KiB: less than the working set, so
        # loads come from both tiers) and a disk tier.
        offload = os.path.join(work, "mono")
        tiers = ["--kv-offload-host-memory", "2MiB", "--kv-offload-dir", offload,
                 "--metrics-port=-1", "--metrics-port-file", os.path.join(work, "mport")]
        with HttpServer(build_dir, *POOL, *tiers) as on:
            got, got_cached, _ = run_sessions(on)
            check(got == ref, "outputs with the tiers on equal those with them off")
            tiered = sum(got_cached[k] for k in later)
            print(f"tiers on: {tiered} cached prompt tokens over turns 2-{TURNS}")
            # Each later turn's history (>= 128 tokens) was evicted from the pool and comes back.
            check(tiered >= pool_only + len(later) * 64,
                  f"tiers must serve the evicted histories: {tiered} vs pool only {pool_only}")
            mport = int(open(os.path.join(work, "mport")).read())
            loaded = metric_sum(mport, "tandem_kv_tier_loaded_blocks_total")
            check(loaded > 0, "tandem_kv_tier_loaded_blocks_total counts the loads")
            check(metric_sum(mport, "tandem_kv_tier_hits_total", 'tier="host"') > 0, "host hits")
            check(metric_sum(mport, "tandem_kv_tier_hits_total", 'tier="disk"') > 0, "disk hits")
            check(on.terminate() == 0, f"SIGTERM: clean exit\n{on.logs()[-2000:]}")
        files = [f for d in os.listdir(offload) for f in os.listdir(os.path.join(offload, d))
                 if f.endswith(".blk")]
        check(len(files) > 0, "blocks on disk after the stop")
        print(f"ok: bit-identical with tiers on, {len(files)} blocks on disk after SIGTERM")

        # Restart on the same directory: the last prompt of session 0 is served from disk.
        prompt = history[0][:-ANSWER]  # the prompt of its last turn
        with HttpServer(build_dir, *POOL, "--kv-offload-dir", offload) as again:
            text, cached = complete(again, prompt)
            check(text == ref[(0, TURNS - 1)], "same output after the restart")
            check(cached >= len(prompt) - 16 - 1,
                  f"restart: {cached} of {len(prompt)} prompt tokens cached (from disk)")
            print(f"ok: after restart {cached} of {len(prompt)} tokens cached, same output")

        # Local cluster: each worker gets DIR/<role>-<index>; the same outputs; a restart of the
        # whole cluster finds the prefill worker's blocks.
        cluster_dir = os.path.join(work, "cluster")
        with HttpCluster(build_dir, *POOL, "--kv-offload-dir", cluster_dir) as cluster:
            got, got_cached, _ = run_sessions(cluster)
            check(got == ref, "cluster outputs with the tiers on equal the monolithic ones off")
            tiered = sum(got_cached[k] for k in later)
            check(tiered >= pool_only + len(later) * 64, f"cluster tiers serve: {tiered}")
            check(cluster.terminate() == 0, f"cluster SIGTERM\n{cluster.logs()[-2000:]}")
        subdirs = sorted(os.listdir(cluster_dir))
        check(subdirs == ["decode-0", "prefill-0"], f"a directory per worker: {subdirs}")
        check(oct(os.stat(cluster_dir).st_mode & 0o777) == "0o700", "created private")
        with HttpCluster(build_dir, *POOL, "--kv-offload-dir", cluster_dir) as cluster:
            text, cached = complete(cluster, prompt)
            check(text == ref[(0, TURNS - 1)], "cluster: same output after the restart")
            check(cached >= len(prompt) - 16 - 1, f"cluster restart: {cached} cached")
            print(f"ok: cluster, {cached} of {len(prompt)} cached after restart, same output")
    finally:
        shutil.rmtree(work, True)
    print("PASS")


if __name__ == "__main__":
    main()
