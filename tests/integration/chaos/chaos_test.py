#!/usr/bin/python3
"""Chaos test: a local cluster (1 router, 2 prefill and 2 decode workers) serves a
steady `tandem bench` load and probe streams while a driver, on a seeded schedule, kills workers
(SIGKILL, or SIGTERM with a drain) and restarts them with fault profiles (KV messages corrupted,
dropped or delayed, KV connections closed, engine steps stalled, KV block allocations refused)
and cancels random streams. Every request's outcome is recorded.

Passes when: nothing is lost (every request completed, was cancelled by its client or failed
with a clear status), nothing outlived its deadline, no process died other than by the driver's
signals (and every SIGTERM drained to exit 0), the probes that completed equal a clean run token
for token (greedy and seeded sampling), corrupted transfers were caught by the checksum, and
afterwards no worker holds a KV block, reservation, transfer or sequence. Every worker runs with
KV cache tiers (host memory and a disk directory of its own that its restarts reopen), so blocks
loaded back from the tiers and pinned for requests are part of the leak check.

Usage: chaos_test.py BUILD_DIR [--seconds N] [--seed S] [--report FILE] [--soak]
Environment (what ctest can pass): TANDEM_CHAOS_SECONDS (default 45), TANDEM_CHAOS_SEED,
TANDEM_CHAOS_REPORT (JSON report path), TANDEM_CHAOS_SOAK=1 (30 minutes unless
TANDEM_CHAOS_SECONDS says otherwise)."""
import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "e2e"))
sys.path.insert(0, HERE)

import grpc  # noqa: E402

from chaos_cluster import Slot  # noqa: E402
from tandem_testlib import (Server, cluster_secret, cluster_status, internal_channel,  # noqa: E402
                            kv_secret, load_stubs, worker_stats)

# Fault profiles a worker incarnation may get (TANDEM_FAULTS without the seed).
PROFILES = {
    "kv_corrupt": "kv_corrupt=0.2",
    "kv_drop": "kv_drop=0.1",
    "kv_close": "kv_close=0.05",
    "kv_delay": "kv_delay_ms=30,kv_delay=0.5",
    "engine_stall": "engine_stall_ms=150,engine_stall_prob=0.05",
    "kv_alloc_fail": "kv_alloc_fail_prob=0.1",
    "mixed": "kv_corrupt=0.05,kv_drop=0.03,kv_delay_ms=10,kv_delay=0.2,engine_stall_ms=50,"
             "engine_stall_prob=0.02,kv_alloc_fail_prob=0.05",
}
CLEAR_CODES = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED",
               "INVALID_ARGUMENT", "FAILED_PRECONDITION", "INTERNAL", "DATA_LOSS"}
REQUEST_TIMEOUT = 90.0  # every request's client deadline (bench and probes)
WORKER_ARGS = ["--drain-timeout", "3", "--threads", "1", "--num-kv-blocks", "192"]

WORDS = ("once upon a time there was a little girl named lily she loved to play outside in the "
         "park one day her mom said we can go to the big tree and see the bird tom was happy "
         "because he had a red ball and a small dog").split()


def probe_requests(stubs, rng):
    """The probe set: (key, GenerateRequest) with text and token-id prompts, greedy, seeded
    sampling, n = 2 and stop strings; lengths cross several KV blocks."""
    shared = " ".join(rng.choice(WORDS) for _ in range(40))
    out = []
    for i in range(12):
        words = rng.randint(3, 60)
        text = " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()
        if i % 3 == 0:
            text = shared + " " + text  # shared prefixes: prefix-cache hits on both sides
        max_tokens = rng.randint(8, 64)
        kind = ["greedy", "seeded", "greedy_ids", "n2_stop"][i % 4]
        sampling = dict(max_tokens=max_tokens, ignore_eos=True)
        kwargs = dict(text=text)
        if kind == "greedy":
            sampling.update(temperature=0)
        elif kind == "seeded":
            sampling.update(temperature=0.9, top_p=0.95, seed=1000 + i)
        elif kind == "greedy_ids":
            sampling.update(temperature=0)
            ids = [1] + [rng.randint(3, 511) for _ in range(rng.randint(4, 150))]
            kwargs = dict(token_ids=stubs.common.TokenIds(ids=ids))
        else:
            sampling.update(temperature=0.8, seed=2000 + i, stop=[" the tree", " red ball"])
            kwargs["n"] = 2
        out.append((f"{i}:{kind}", stubs.gen.GenerateRequest(
            sampling=stubs.sampling.SamplingParams(**sampling), **kwargs)))
    return out


def run_stream(stubs, stub, request, cancel_after=None, timeout=REQUEST_TIMEOUT):
    """One Generate stream; returns a record with its outcome and what it received."""
    rec = {"outcome": None, "code": "OK", "details": "", "samples": {}, "start": time.time()}
    call = stub.Generate(request, timeout=timeout)
    received = 0
    try:
        for r in call:
            if r.HasField("chunk"):
                s = rec["samples"].setdefault(r.chunk.index, {"ids": [], "text": "", "end": None})
                s["ids"].extend(r.chunk.token_ids)
                s["text"] += r.chunk.text
                received += len(r.chunk.token_ids)
                if cancel_after is not None and received >= cancel_after:
                    call.cancel()
            else:
                s = rec["samples"].setdefault(r.final.index, {"ids": [], "text": "", "end": None})
                s["end"] = stubs.common.FinishReason.Name(r.final.finish_reason)
        rec["outcome"] = "completed"
    except grpc.RpcError as e:
        rec["code"], rec["details"] = e.code().name, e.details() or ""
        if e.code() == grpc.StatusCode.CANCELLED and cancel_after is not None:
            rec["outcome"] = "cancelled"
        elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and \
                time.time() - rec["start"] >= timeout - 1:
            rec["outcome"] = "hung"
        else:
            rec["outcome"] = "failed"
    rec["end"] = time.time()
    return rec


def reference_outputs(build_dir, stubs, probes):
    """The probes' outputs from a clean single-process server (no faults, nothing killed)."""
    want = {}
    with Server(build_dir, "--threads", "1") as mono:
        stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(mono.address))
        for key, req in probes:
            rec = run_stream(stubs, stub, req)
            if rec["outcome"] != "completed":
                raise AssertionError(f"clean run of probe {key}: {rec}")
            want[key] = rec["samples"]
    return want


class Chaos:
    def __init__(self, args, stubs):
        self.args, self.stubs = args, stubs
        self.rng = random.Random(args.seed)
        self.tmp = tempfile.mkdtemp(prefix="tandem-chaos-")
        self.stop_load = threading.Event()
        self.events = []
        self.probes = []
        self.lock = threading.Lock()
        # Held while the driver stops and restarts a worker, so that check_crashes never takes
        # the driver's own kill (or a drain in progress) for a crash.
        self.slot_lock = threading.Lock()
        b = args.build_dir
        # The cluster runs with its secret on: every router -> worker call proves it.
        secret = ["--cluster-secret-file", cluster_secret()[0]]
        worker_args = WORKER_ARGS + secret + ["--kv-secret-file", kv_secret()[0]]
        # KV cache tiers on every worker: a small host tier and a disk tier of its
        # own, which a restarted incarnation (after SIGKILL mid write-behind, or a drain) reopens;
        # the leak checks below then cover blocks loaded from the tiers and pinned for requests.
        def tiers(name):
            return ["--kv-offload-host-memory", "2MiB", "--kv-offload-dir",
                    os.path.join(self.tmp, f"kv-{name}"), "--kv-offload-disk-size", "64MiB"]
        self.prefill = [Slot(b, f"prefill{i}", "prefill", worker_args + tiers(f"prefill{i}"),
                             self.tmp) for i in range(2)]
        self.decode = [Slot(b, f"decode{i}", "decode", worker_args + tiers(f"decode{i}"),
                            self.tmp) for i in range(2)]
        self.workers = self.prefill + self.decode
        self.router = Slot(b, "router", "router", [
            "--prefill-addresses", ",".join(s.address for s in self.prefill),
            "--decode-addresses", ",".join(s.address for s in self.decode),
            "--disagg-min-uncached-tokens", "0", "--prefill-timeout", "20",
            "--drain-timeout", "5", *secret], self.tmp)
        # Every fault kind comes up early (a short run still covers them all), then at random.
        self.profile_cycle = list(PROFILES)
        self.rng.shuffle(self.profile_cycle)
        self.fault_seed = args.seed * 1000

    def next_profile(self):
        if self.profile_cycle:
            name = self.profile_cycle.pop()
        else:
            name = self.rng.choice(list(PROFILES) + ["none", "none"])
        if name == "none":
            return name, ""
        self.fault_seed += 1
        return name, f"{PROFILES[name]},seed={self.fault_seed}"

    def start(self):
        for slot in self.workers:
            # Half the first incarnations are clean, half get a fault profile.
            name, spec = self.next_profile() if self.rng.random() < 0.5 else ("none", "")
            slot.start(spec)
            slot.profile = name
        self.router.start()
        self.channel = grpc.insecure_channel(self.router.address)
        self.stub = self.stubs.gen_grpc.GenerationStub(self.channel)
        deadline = time.time() + 60
        while True:
            status = cluster_status(self.stubs, self.channel)
            if sum(w.healthy for w in status.workers) == len(self.workers):
                return
            if time.time() > deadline:
                raise AssertionError(f"workers did not register: {status}")
            time.sleep(0.2)

    def log_event(self, **kw):
        kw["t"] = round(time.time() - self.t0, 2)
        self.events.append(kw)
        print(f"chaos t={kw['t']:7.2f}s " + " ".join(f"{k}={v}" for k, v in kw.items() if k != "t"),
              flush=True)

    def driver(self, until):
        """The seeded schedule: one worker at a time is killed and restarted."""
        while time.time() < until:
            time.sleep(self.rng.uniform(2.0, 5.0))
            if time.time() >= until:
                break
            slot = self.rng.choice(self.workers)
            sig = signal.SIGKILL if self.rng.random() < 0.6 else signal.SIGTERM
            downtime = self.rng.uniform(0.2, 2.0)
            profile, spec = self.next_profile()
            self.check_crashes()
            with self.slot_lock:
                rc = slot.stop(sig, timeout=30)
                time.sleep(downtime)
                slot.start(spec)
                slot.profile = profile
            self.log_event(action=signal.Signals(sig).name, worker=slot.name, rc=rc,
                           downtime=round(downtime, 2), new_profile=profile)

    def check_crashes(self):
        """Restarts (and records) any process that died without the driver's signal."""
        with self.slot_lock:
            for slot in self.workers:
                if slot.check_unexpected_exit():
                    self.log_event(action="CRASH", worker=slot.name, rc=slot.proc.returncode)
                    slot.start("")
                    slot.profile = "none"

    def probe_loop(self, index):
        rng = random.Random(self.args.seed * 100 + index)
        while not self.stop_load.is_set():
            key, req = rng.choice(self.probe_set)
            cancel_after = rng.randint(1, 8) if rng.random() < 0.15 else None
            rec = run_stream(self.stubs, self.stub, req, cancel_after)
            rec["key"], rec["cancel_after"] = key, cancel_after
            if rec["outcome"] == "completed" and rec["samples"] != self.want[key]:
                rec["outcome"] = "mismatch"
            with self.lock:
                self.probes.append(rec)

    def run_bench(self, seconds, out_json):
        cmd = [os.path.join(self.args.build_dir, "bin", "tandem"), "bench", "--target",
               self.router.address, "--concurrency", str(self.args.bench_concurrency),
               "--duration", str(seconds), "--prompt-len", "uniform:4:96", "--output-len",
               "uniform:4:48", "--shared-prefixes", "4", "--prefix-len", "32",
               "--cancel-fraction", "0.1", "--request-timeout", str(REQUEST_TIMEOUT),
               "--seed", str(self.args.seed), "--allow-errors", "--quiet",
               "--progress-interval", "0", "--json-out", out_json]
        with open(os.path.join(self.tmp, "bench.log"), "wb") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def run(self, want, probe_set):
        self.want, self.probe_set = want, probe_set
        self.start()
        self.t0 = time.time()
        until = self.t0 + self.args.seconds
        bench_json = os.path.join(self.tmp, "bench.json")
        bench = self.run_bench(self.args.seconds, bench_json)
        probers = [threading.Thread(target=self.probe_loop, args=(i,))
                   for i in range(self.args.probes)]
        for t in probers:
            t.start()
        driver = threading.Thread(target=self.driver, args=(until,))
        driver.start()
        while driver.is_alive():
            driver.join(1)
            self.check_crashes()
        self.stop_load.set()
        for t in probers:
            t.join(REQUEST_TIMEOUT + 30)
        lost_probes = sum(t.is_alive() for t in probers)
        try:
            bench.wait(REQUEST_TIMEOUT + 60)
        except subprocess.TimeoutExpired:
            bench.kill()
        self.check_crashes()
        if os.path.exists(bench_json):
            with open(bench_json) as f:
                bench_report = json.load(f)
        else:  # the bench never finished: its requests count as lost
            bench_report = {"requests": {"issued": 1, "completed": 0, "cancelled": 0,
                                         "failed": 0}, "errors": {}}
        leaks = self.wait_no_leaks()
        status = cluster_status(self.stubs, self.channel)
        router_rc = self.router.stop(signal.SIGTERM, timeout=30)
        for slot in self.workers:
            slot.stop(signal.SIGTERM, timeout=30)
        return self.report(bench_report, lost_probes, leaks, status, router_rc)

    def wait_no_leaks(self, timeout=30):
        """Every worker's stats once nothing is left in flight (or the last ones seen)."""
        deadline = time.time() + timeout
        while True:
            stats = {}
            for slot in self.workers:
                s = worker_stats(self.stubs, internal_channel(slot.address))
                stats[slot.name] = {k: getattr(s, k) for k in (
                    "kv_blocks_used", "awaiting_kv", "kv_blocks_held", "transfers_in_flight",
                    "running", "waiting")}
            if all(not any(v.values()) for v in stats.values()) or time.time() > deadline:
                return stats
            time.sleep(0.2)

    def report(self, bench, lost_probes, leaks, status, router_rc):
        outcomes = collections.Counter(p["outcome"] for p in self.probes)
        failures = collections.Counter(f"{p['code']}: {p['details']}" for p in self.probes
                                       if p["outcome"] == "failed")
        req = bench["requests"]
        logs = {s.name: s.log_text() for s in self.workers + [self.router]}
        # Detected: a decode worker's receiver failed a transfer on its CRC32C. Retried: the
        # router re-sent that prefill (another attempt, or a local prefill).
        detected = sum(line.count("KV transfer failed: DATA_LOSS: checksum mismatch")
                       for s in self.decode for line in [logs[s.name]])
        retried = sum(1 for line in logs["router"].splitlines()
                      if "prefill on" in line and "failed (" in line and "checksum mismatch" in line)
        # The KV tiers at work: blocks a restarted worker found in its directory, blocks written
        # at shutdown, corrupt files dropped (a torn write after SIGKILL is one).
        found = [int(m) for s in self.workers for m in re.findall(
            r"KV disk tier \S+: (\d+) blocks", logs[s.name])]
        tiers = {"restarts_with_blocks": sum(1 for n in found if n > 0),
                 "blocks_found_at_restart": sum(found),
                 "blocks_written_at_shutdown": sum(int(m) for s in self.workers for m in re.findall(
                     r"KV tiers: (\d+) cached pool blocks written", logs[s.name])),
                 "corrupt_files_dropped": sum(logs[s.name].count("failed its checks")
                                              for s in self.workers)}
        crashes = [f"{s.name} incarnation {i}: {inc['crash']}"
                   for s in self.workers + [self.router]
                   for i, inc in enumerate(s.incarnations) if inc["crash"]]
        crashes += [f"{s.name}: {line}" for s in self.workers + [self.router]
                    for line in s.crash_lines()]
        if router_rc != 0:
            crashes.append(f"router exit status {router_rc} after SIGTERM")
        unclear = {m: n for m, n in list(bench["errors"].items()) + list(failures.items())
                   if m.split(":")[0] not in CLEAR_CODES or not m.split(":", 1)[1].strip()}
        return {
            "seed": self.args.seed,
            "seconds": self.args.seconds,
            "bench": {"issued": req["issued"], "completed": req["completed"],
                      "cancelled": req["cancelled"], "failed": req["failed"],
                      "lost": req["issued"] - req["completed"] - req["cancelled"] - req["failed"],
                      "errors": bench["errors"]},
            "probes": {"sent": len(self.probes) + lost_probes, "outcomes": dict(outcomes),
                       "lost": lost_probes, "failures": dict(failures)},
            "hung": outcomes["hung"] + sum(n for m, n in bench["errors"].items()
                                           if m.startswith("DEADLINE_EXCEEDED")),
            "mismatches": outcomes["mismatch"],
            "mismatch_examples": [{"key": p["key"], "got": p["samples"], "want": self.want[p["key"]]}
                                  for p in self.probes if p["outcome"] == "mismatch"][:3],
            "unclear_errors": unclear,
            "events": collections.Counter(e["action"] for e in self.events),
            "profiles_used": collections.Counter(
                inc["faults"].split("=")[0] if inc["faults"] else "none"
                for s in self.workers for inc in s.incarnations),
            "corrupt_transfers_detected": detected,
            "corrupt_transfers_retried": retried,
            "kv_tiers": tiers,
            "router": {"requests": status.requests, "remote_prefills": status.remote_prefills,
                       "local_prefills": status.local_prefills,
                       "prefill_retries": status.prefill_retries,
                       "migrations": status.migrations, "failures": status.failures},
            "crashes": crashes,
            "leaks_after": {k: v for k, v in leaks.items() if any(v.values())},
            "logs": self.tmp,
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    soak = os.environ.get("TANDEM_CHAOS_SOAK") == "1"
    parser.add_argument("--soak", action="store_true", default=soak, help="30 minutes")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get(
        "TANDEM_CHAOS_SECONDS", 0)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("TANDEM_CHAOS_SEED", 1)))
    parser.add_argument("--report", default=os.environ.get("TANDEM_CHAOS_REPORT", ""))
    parser.add_argument("--probes", type=int, default=3, help="probe streams in parallel")
    parser.add_argument("--bench-concurrency", type=int, default=6)
    args = parser.parse_args()
    if args.seconds <= 0:
        args.seconds = 1800 if args.soak else 45
    stubs = load_stubs()
    probe_set = probe_requests(stubs, random.Random(args.seed))
    want = reference_outputs(args.build_dir, stubs, probe_set)
    chaos = Chaos(args, stubs)
    try:
        r = chaos.run(want, probe_set)
    finally:
        for slot in chaos.workers + [chaos.router]:
            if slot.alive():
                slot.proc.kill()
    text = json.dumps(r, indent=2, sort_keys=True)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    problems = []
    if r["bench"]["lost"] or r["probes"]["lost"]:
        problems.append("requests lost")
    if r["hung"]:
        problems.append(f"{r['hung']} requests outlived their deadline")
    if r["mismatches"]:
        problems.append(f"{r['mismatches']} completed probes differ from the clean run")
    if r["unclear_errors"]:
        problems.append(f"errors without a clear status: {r['unclear_errors']}")
    if r["crashes"]:
        problems.append(f"crashes: {r['crashes']}")
    if r["leaks_after"]:
        problems.append(f"leaks after the run: {r['leaks_after']}")
    if "kv_corrupt" in r["profiles_used"] and not (r["corrupt_transfers_detected"] and
                                                   r["corrupt_transfers_retried"]):
        problems.append("a kv_corrupt profile ran but no corrupted transfer was detected and "
                        "retried")
    done = r["bench"]["completed"] + r["probes"]["outcomes"].get("completed", 0)
    failed = r["bench"]["failed"] + r["probes"]["outcomes"].get("failed", 0)
    if failed > 0.1 * max(1, done + failed):
        problems.append(f"too many failures: {failed} failed against {done} completed")
    if done == 0:
        problems.append("nothing completed")
    if problems:
        print("FAIL: " + "; ".join(problems))
        sys.exit(1)
    print(f"PASS: {done} completed, {failed} failed with a clear status, 0 lost, 0 hung, "
          f"0 crashes, {r['events']} events, no leaks")


if __name__ == "__main__":
    main()
