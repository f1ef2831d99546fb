#!/usr/bin/python3
"""Observability end to end, with Debian's real Prometheus:

1. starts a local Tandem cluster with /metrics enabled and JSON logs: `tandem serve` (monolithic;
   `--mode cluster:P,D` runs `tandem serve --prefill-workers P --decode-workers D`), and drives
   load through it with a real gRPC client (streams with shared prefixes, n > 1, stop strings,
   cancellations, invalid requests, prompts repeated after their blocks left the pool, requests for a LoRA
   adapter); KV cache tiers (host and disk) and n-gram speculation are on;
2. `promtool check metrics` passes on every process's /metrics;
3. starts `prometheus` on loopback scraping the processes every second with
   deploy/prometheus/tandem-rules.yaml loaded, then runs every PromQL expression of every
   Grafana dashboard panel (deploy/grafana/*.json, variables substituted), every recording
   rule's expression and every recorded series through the HTTP API, and asserts each returns
   data with a finite value, except the panels and rules listed in EXPECTED_ABSENT for the mode,
   which must return nothing (so the list cannot go stale); every rule evaluates without error;
4. the counters agree with what the client saw, and the logs have one JSON line per request
   state change with request id, component and level.

Usage: prometheus_dashboards_test.py BUILD_DIR [--mode monolithic|cluster:P,D]
(default: $TANDEM_OBS_MODE, else monolithic; ctest runs monolithic and cluster:1,2)
"""
import argparse
import concurrent.futures
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "deploy"))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import grpc  # noqa: E402
import deploylib  # noqa: E402
from peft_np import write_adapter  # noqa: E402
from tandem_testlib import check, load_stubs, make_prompt  # noqa: E402

NOT_IN_ONE_PROCESS = ("monolithic serve moves no KV between processes: kvtransfer (and its "
                      "TransferMetrics) only runs between prefill and decode workers")
NO_REGISTRY = ("monolithic serve routes in-process to its one worker: no worker registry, so no "
               "routing decisions and no worker health")
NO_WORKER_API = ("monolithic serve's router calls its engine in-process, bypassing the gRPC "
                 "worker service whose streams WorkerMetrics counts")
MODEL = os.path.join(ROOT, "models", "stories260k")

# Dashboard panels ("uid / panel title") and recording rules whose series legitimately do not
# exist in a mode, with the reason. The test asserts they return NO data there.
EXPECTED_ABSENT = {
    "monolithic": {
        "tandem-disaggregation / KV transfer latency": NOT_IN_ONE_PROCESS,
        "tandem-disaggregation / KV transfer throughput": NOT_IN_ONE_PROCESS,
        "tandem-disaggregation / Bytes per transfer": NOT_IN_ONE_PROCESS,
        "tandem-disaggregation / Transfers and failures": NOT_IN_ONE_PROCESS,
        "tandem-disaggregation / Worker streams": NO_WORKER_API,
        "tandem-disaggregation / Routing decisions": NO_REGISTRY,
        "tandem-disaggregation / Healthy workers per role": NO_REGISTRY,
        "tandem-disaggregation / Unhealthy workers": NO_REGISTRY,
        "job_transport_quantile:tandem_kv_transfer_duration_seconds:histogram_quantile_5m":
            NOT_IN_ONE_PROCESS,
        "job:tandem_kv_transfer_failures:ratio_rate5m": NOT_IN_ONE_PROCESS,
    },
    # A local disaggregated cluster has transfers, a registry and worker streams.
    "cluster": {
    },
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, predicate, timeout, proc=None, logs=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{logs()}")
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}\n{logs()}")


class Cluster:
    """`tandem serve` with /metrics on a free port and JSON logs; targets are (job, address)."""

    def __init__(self, build_dir, mode):
        self.tmp = tempfile.mkdtemp(prefix="tandem-obs-")
        self.log_path = os.path.join(self.tmp, "serve.log")
        port_file = os.path.join(self.tmp, "port")
        self.metrics_port_file = os.path.join(self.tmp, "metrics-port")
        exe = os.path.join(build_dir, "bin", "tandem")
        # KV tiers (a small host tier over a disk tier, so both fill and the clients' repeated
        # prompts load blocks back), n-gram speculation and one LoRA adapter.
        cmd = [exe, "serve", "--model", MODEL, "--port", "0", "--port-file", port_file,
               "--metrics-port=-1", f"--metrics-port-file={self.metrics_port_file}", "--log-json",
               "--num-kv-blocks", "96", "--max-num-seqs", "16", "--threads", "2",
               "--kv-offload-host-memory", "256KiB", "--kv-offload-dir",
               os.path.join(self.tmp, "kv-tiers"), "--speculative-method", "ngram",
               "--num-speculative-tokens", "3"]
        self.lora = "obs-adapter"
        adapter = os.path.join(self.tmp, self.lora)
        write_adapter(json.load(open(os.path.join(MODEL, "config.json"))), adapter, seed=5)
        cmd += ["--lora-modules", f"{self.lora}={adapter}"]
        if mode.startswith("cluster:"):
            p, d = mode.split(":")[1].split(",")
            cmd += ["--prefill-workers", p, "--decode-workers", d]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("tandem serve", lambda: os.path.exists(port_file) and
                 os.path.exists(self.metrics_port_file), 120, self.proc, self.logs)
        self.address = f"127.0.0.1:{int(open(port_file).read())}"
        self.targets = [("tandem-serve", f"127.0.0.1:{int(open(self.metrics_port_file).read())}")]
        # Cluster mode: the workers' /metrics, one "role host:port" per line.
        workers = self.metrics_port_file + ".workers"
        if mode.startswith("cluster:"):
            wait_for("worker metrics addresses", lambda: os.path.exists(workers), 60, self.proc,
                     self.logs)
            for line in open(workers).read().split("\n"):
                if line.strip():
                    role, addr = line.split()
                    self.targets.append((f"tandem-{role}", addr))

    def logs(self):
        self.log.flush()
        return open(self.log_path, "rb").read().decode("utf-8", "replace")[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Prometheus:
    def __init__(self, targets):
        self.tmp = tempfile.mkdtemp(prefix="tandem-prom-")
        jobs = {}
        for job, addr in targets:
            jobs.setdefault(job, []).append(addr)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                       "evaluation_interval": "1s"},
            "rule_files": [deploylib.RULES_FILE],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": addrs}]}
                               for job, addrs in sorted(jobs.items())],
        }
        config_path = os.path.join(self.tmp, "prometheus.yml")
        json.dump(config, open(config_path, "w"))  # JSON is YAML
        r = subprocess.run(["promtool", "check", "config", config_path], capture_output=True,
                           text=True)
        check(r.returncode == 0, f"promtool check config:\n{r.stdout}{r.stderr}")
        self.log_path = os.path.join(self.tmp, "prometheus.log")
        for _ in range(3):
            self.url = f"http://127.0.0.1:{free_port()}"
            self.log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config_path}",
                 f"--storage.tsdb.path={os.path.join(self.tmp, 'data')}",
                 f"--web.listen-address={self.url[len('http://'):]}", "--log.level=warn",
                 "--storage.tsdb.retention.time=1h"],
                stdout=self.log, stderr=subprocess.STDOUT)
            try:
                wait_for("prometheus ready", lambda: "Ready" in http_get(self.url + "/-/ready"),
                         60, self.proc, self.logs)
                return
            except RuntimeError:
                self.stop()  # port taken between probe and bind: try another
        raise RuntimeError(f"prometheus did not start:\n{self.logs()}")

    def logs(self):
        self.log.flush()
        return open(self.log_path, "rb").read().decode("utf-8", "replace")[-4000:]

    def query(self, expr):
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            raise AssertionError(f"query failed ({e.code}): {expr}\n{e.read().decode()}")
        check(body["status"] == "success", f"query failed: {expr}: {body}")
        return body["data"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Load:
    """Client traffic in background threads; counts what the client saw."""

    def __init__(self, stubs, address, lora=None):
        self.stubs, self.address, self.lora = stubs, address, lora
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "invalid": 0, "cancelled": 0, "other": 0}
        self.tokens = 0
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(6)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(120)

    def one(self, stub, rng, kind, sent):
        gen, sampling = self.stubs.gen, self.stubs.sampling
        system = "Once upon a time there was a little girl named Lily. She loved to play. "
        if kind == "invalid":
            req = gen.GenerateRequest(text="", sampling=sampling.SamplingParams(max_tokens=4))
        else:
            if kind == "again" and len(sent) > 24:
                # A prompt of a while ago: its blocks have left the pool for the KV tiers.
                prompt = sent[rng.randint(0, len(sent) - 24)]
            else:
                prompt = (system * rng.randint(1, 3)) + make_prompt(rng, 1, 20)
                sent.append(prompt)
            req = gen.GenerateRequest(
                text=prompt, n=2 if kind == "n2" else 1,
                model=self.lora if kind == "lora" else "",
                sampling=sampling.SamplingParams(
                    temperature=0 if kind != "n2" else 0.8, seed=rng.randint(1, 1000),
                    max_tokens=400 if kind == "cancel" else rng.randint(8, 48),
                    ignore_eos=kind != "stop", stop=["Lily"] if kind == "stop" else []))
        tokens = 0
        try:
            call = stub.Generate(req, timeout=120)
            for r in call:
                if kind == "cancel":  # the client goes away after the first message
                    call.cancel()
                    raise grpc.RpcError()
                if r.HasField("chunk"):
                    tokens += len(r.chunk.token_ids)
            outcome = "ok"
        except grpc.RpcError as e:
            if kind == "cancel":
                with self.lock:
                    self.counts["cancelled"] += 1
                return
            outcome = {grpc.StatusCode.INVALID_ARGUMENT: "invalid",
                       grpc.StatusCode.DEADLINE_EXCEEDED: "cancelled",
                       grpc.StatusCode.CANCELLED: "cancelled"}.get(e.code(), "other")
        with self.lock:
            self.counts[outcome] += 1
            if outcome == "ok":
                self.tokens += tokens

    def run(self, i):
        rng = random.Random(i)
        stub = self.stubs.gen_grpc.GenerationStub(grpc.insecure_channel(self.address))
        kinds = ["plain"] * 6 + ["n2", "stop", "cancel", "invalid", "again", "again"]
        if self.lora:
            kinds += ["lora", "lora"]
        sent = []
        while not self.stop_event.is_set():
            self.one(stub, rng, rng.choice(kinds), sent)


def is_finite_result(data):
    if data["resultType"] == "vector":
        return any(math.isfinite(float(s["value"][1])) for s in data["result"])
    if data["resultType"] == "scalar":
        return math.isfinite(float(data["result"][1]))
    return False


def check_promtool_metrics(targets):
    for job, addr in targets:
        text = http_get(f"http://{addr}/metrics")
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True)
        check(r.returncode == 0, f"promtool check metrics {job} {addr}:\n{r.stdout}{r.stderr}")
        families = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}
        ours = {f for f in families if f.startswith("tandem_")}
        check(families == ours, f"{addr}: unexpected families {sorted(families - ours)}")
        print(f"ok: promtool check metrics {job} {addr}: {len(ours)} tandem_ families")


def check_queries(prom, mode):
    absent = EXPECTED_ABSENT["cluster" if mode.startswith("cluster") else mode]
    used_absent, failures, n = set(), [], 0
    for q in deploylib.dashboard_queries():
        panel = f"{q.uid} / {q.panel}"
        data = prom.query(deploylib.substitute(q.expr))
        n += 1
        if panel in absent:
            used_absent.add(panel)
            if data["result"]:
                failures.append(f"{q.key}: expected no data ({absent[panel]}) but got "
                                f"{len(data['result'])} series; remove it from EXPECTED_ABSENT")
        elif not is_finite_result(data):
            failures.append(f"{q.key}: no finite data for {q.expr}: {data['result'][:3]}")
    for record, expr, labels in deploylib.recording_rules():
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for what, e in (("expr", expr), ("recorded", f"{record}{{{selector}}}")):
            data = prom.query(e)
            n += 1
            if record in absent:
                used_absent.add(record)
                if data["result"]:
                    failures.append(f"rule {record} ({what}): expected no data ({absent[record]})")
            elif not is_finite_result(data):
                failures.append(f"rule {record} ({what}): no finite data: {data['result'][:3]}")
    stale = set(absent) - used_absent
    check(not stale, f"EXPECTED_ABSENT names unknown panels or rules: {sorted(stale)}")
    check(not failures, "\n".join(failures))
    print(f"ok: {n} dashboard and recording-rule queries return data "
          f"({len(absent)} panels/rules absent by design in {mode})")
    for name, reason in sorted(absent.items()):
        print(f"    absent: {name}: {reason}")


def check_rules_healthy(prom):
    body = json.loads(http_get(prom.url + "/api/v1/rules"))
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    check(len(rules) == len(deploylib.recording_rules()) + len(deploylib.alerting_rules()),
          f"prometheus loaded {len(rules)} rules")
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    check(not bad, f"rules with evaluation errors: {bad}")
    firing = [r["name"] for r in rules if r.get("type") == "alerting" and r["state"] == "firing"]
    print(f"ok: {len(rules)} rules evaluate without errors (firing: {firing or 'none'})")


def scrape_value(addr, name, labels=()):
    total = None
    for line in http_get(f"http://{addr}/metrics").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels):
                total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def check_counts(cluster, load):
    addr = cluster.targets[0][1]
    invalid = scrape_value(addr, "tandem_router_requests_total", [("outcome", "invalid")])
    check(invalid == load.counts["invalid"],
          f"tandem_router_requests_total{{outcome=invalid}} = {invalid}, client saw "
          f"{load.counts['invalid']}")
    # A request can finish at the router just as its client's deadline fires: ok there,
    # DEADLINE_EXCEEDED at the client. Only such requests may differ.
    ok = scrape_value(addr, "tandem_router_requests_total", [("outcome", "ok")])
    check(load.counts["ok"] <= ok <= load.counts["ok"] + load.counts["cancelled"],
          f"tandem_router_requests_total{{outcome=ok}} = {ok}, client saw {load.counts['ok']} ok "
          f"and {load.counts['cancelled']} cancelled")
    cancelled = scrape_value(addr, "tandem_router_requests_total", [("outcome", "cancelled")])
    check(cancelled is not None and cancelled >= 1, "cancelled requests are counted")
    total = scrape_value(addr, "tandem_router_requests_total")
    check(total == sum(load.counts.values()), f"{total} requests counted, client sent "
          f"{sum(load.counts.values())}")
    check(scrape_value(addr, "tandem_router_requests_in_flight") == 0, "nothing in flight")
    gen = scrape_value(addr, "tandem_router_request_generation_tokens_sum")
    check(gen >= load.tokens, f"router counted {gen} tokens, ok requests received {load.tokens}")
    print(f"ok: request counters match the client: {load.counts}")


def check_logs(cluster):
    lines = [ln for ln in open(cluster.log_path, encoding="utf-8").read().splitlines() if ln]
    events = {}
    for ln in lines:
        try:
            j = json.loads(ln)
        except ValueError:
            raise AssertionError(f"--log-json wrote a non-JSON line: {ln!r}")
        for key in ("ts", "level", "component", "msg", "src"):
            check(key in j, f"log line without {key}: {ln}")
        if "event" in j:
            check(j.get("request_id") is not None, f"state change without request_id: {ln}")
            events.setdefault(j["event"], []).append(j)
    for e in ("received", "queued", "finished"):
        check(events.get(e), f"no '{e}' log lines")
    received = {j["request_id"] for j in events["received"]}
    finished = {j["request_id"] for j in events["finished"] if "outcome" in j}
    check(received <= finished, f"{len(received - finished)} received requests never logged "
          f"'finished'")
    check(all(j["outcome"] and j["finish_reason"] for j in events["finished"] if "outcome" in j),
          "finished lines carry outcome and finish_reason")
    print(f"ok: {len(lines)} JSON log lines; events: "
          + ", ".join(f"{k} {len(v)}" for k, v in sorted(events.items())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--mode", default=os.environ.get("TANDEM_OBS_MODE", "monolithic"))
    args = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        check(shutil.which(tool), f"{tool} not installed (scripts/setup.sh installs it)")
    usage = subprocess.run([os.path.join(args.build_dir, "bin", "tandem"), "serve", "--help"],
                           capture_output=True, text=True)
    check("--metrics-port" in usage.stdout + usage.stderr,
          "`tandem serve` has no --metrics-port flag (common/metrics/process_metrics.h)")
    started = time.time()
    stubs = load_stubs()
    cluster = Cluster(args.build_dir, args.mode)
    prom = None
    try:
        prom = Prometheus(cluster.targets)
        load = Load(stubs, cluster.address, cluster.lora)
        load.start()
        # Enough scrapes and rule evaluations for 1m rates and the 5m recording rules.
        wait_for("recorded TTFT quantiles", lambda: prom.query(
            'job_quantile:tandem_router_time_to_first_token_seconds:histogram_quantile_5m'
            '{quantile="0.99"} > 0')["result"], 90, logs=prom.logs)
        wait_for("blocks loaded back from the KV tiers", lambda: prom.query(
            'sum(tandem_kv_tier_load_duration_seconds_count) > 0')["result"], 60,
            logs=prom.logs)
        time.sleep(4)
        check_promtool_metrics(cluster.targets)
        check_queries(prom, args.mode)
        check_rules_healthy(prom)
        load.stop()
        time.sleep(1.5)
        check_counts(cluster, load)
    except BaseException:
        print("--- serve log tail ---\n" + cluster.logs())
        if prom is not None:
            print("--- prometheus log tail ---\n" + prom.logs())
        raise
    finally:
        if prom is not None:
            prom.stop()
        cluster.stop()
    check_logs(cluster)
    shutil.rmtree(cluster.tmp, True)
    if prom is not None:
        shutil.rmtree(prom.tmp, True)
    print(f"PASS ({time.time() - started:.1f}s)")


if __name__ == "__main__":
    main()
