#!/usr/bin/python3
"""LoRA adapters across a cluster: `tandem serve --prefill-workers 1
--decode-workers 1` with --lora-modules. An adapter request prefilled on the prefill worker and
decoded on the decode worker gives the same greedy tokens as one process; /v1/models lists the
adapters and `model` selects them; /v1/load_lora_adapter loads on the workers (evicting their
least recently used adapter within --max-cpu-loras 1), and a request for an adapter a worker
evicted loads it there on demand; the workers report their adapters; a decode worker refuses a
request for an adapter it does not have and a KV transfer computed with another adapter than its
reservation's, and a prefill worker refuses a reservation for another adapter; unloading
through the router unloads on the workers."""
import os
import sys
import tempfile
import time
import json

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from http_api_test import HttpServer, post, post_json  # noqa: E402
from peft_np import write_adapter  # noqa: E402
from serve_lora_test import complete, get_json  # noqa: E402
from tandem_testlib import ROOT, Cluster, check, cluster_status, worker_stats  # noqa: E402
from tandem_testlib import attempt_target, load_stubs  # noqa: E402

MODEL = os.path.join(ROOT, "models", "stories260k")
# Long enough (over --disagg-min-uncached-tokens 32) to be prefilled on the prefill worker.
PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in "
          "the park with her friends. One day she saw a big red ball")
# Another prompt, for the on-demand load: no worker has its blocks cached under any adapter.
PROMPT2 = ("Tom had a small dog called Max. Every morning they walked to the river and looked at "
           "the boats. One day the dog found a shiny stone")


class HttpCluster(Cluster):
    """A local 1P+1D cluster with the HTTP API on a free port."""

    def __init__(self, build_dir, *args):
        self.http_tmp = tempfile.mkdtemp(prefix="tandem-http-")
        port_file = os.path.join(self.http_tmp, "http_port")
        super().__init__(build_dir, 1, 1, "--http-port", "0", "--http-port-file", port_file,
                         *args)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            check(time.time() < deadline and self.proc.poll() is None,
                  f"no HTTP port:\n{self.logs()}")
            time.sleep(0.05)
        self.http_port = int(open(port_file).read())


def adapters(stubs, channel):
    return {a.name: a for a in worker_stats(stubs, channel).lora_adapters}


def wait_adapters(stubs, channel, want, what):
    deadline = time.time() + 10
    while set(adapters(stubs, channel)) != want:
        check(time.time() < deadline, f"{what}: adapters {sorted(adapters(stubs, channel))}, "
              f"want {sorted(want)}")
        time.sleep(0.05)


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    tmp = tempfile.mkdtemp(prefix="tandem-lora-cluster-")
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    dirs = {}
    for i, name in enumerate(["sql", "poet"]):
        dirs[name] = os.path.join(tmp, name)
        write_adapter(cfg, dirs[name], seed=i + 1, amplitude=0.15)

    # One process: the reference outputs.
    with HttpServer(build_dir, "--model", MODEL, "--lora-modules", f"sql={dirs['sql']}",
                    f"poet={dirs['poet']}", "--max-loras", "2") as server:
        want = {m: complete(server.http_port, m, 24, PROMPT) for m in ("stories260k", "sql", "poet")}
        want2 = complete(server.http_port, "sql", 24, PROMPT2)
    check(len(set(want.values())) == 3, f"the adapters change nothing: {want}")

    with HttpCluster(build_dir, "--model", MODEL, "--lora-modules", f"sql={dirs['sql']}",
                     "--max-loras", "1", "--max-cpu-loras", "1",
                     "--allow-runtime-lora-updating") as cluster:
        port = cluster.http_port
        channels = cluster.worker_channels()
        prefill, decode = channels["prefill"][0], channels["decode"][0]
        status, models = get_json(port, "/v1/models")
        by_id = {m["id"]: m for m in models["data"]}
        check(status == 200 and set(by_id) == {"stories260k", "sql"} and
              by_id["sql"]["parent"] == "stories260k", f"/v1/models: {status} {models}")
        for ch in (prefill, decode):
            check(set(adapters(stubs, ch)) == {"sql"}, "a worker does not report its adapter")
        router = grpc.insecure_channel(cluster.address)
        before = cluster_status(stubs, router).remote_prefills
        got = complete(port, "sql", 24, PROMPT)
        check(got == want["sql"], f"1P+1D with the adapter: {got!r} != one process "
              f"{want['sql']!r}")
        check(complete(port, "stories260k", 24, PROMPT) == want["stories260k"],
              "1P+1D base model output differs")
        check(cluster_status(stubs, router).remote_prefills >= before + 2,
              "the requests were not prefilled on the prefill worker")
        print("ok: an adapter request through 1P+1D (remote prefill) gives one process's greedy "
              "tokens; /v1/models lists the adapter")

        # Runtime load on the workers: --max-cpu-loras 1 evicts sql there.
        status, _, body = post(port, "/v1/load_lora_adapter",
                               {"lora_name": "poet", "lora_path": dirs["poet"]})
        check(status == 200, f"load: {status} {body!r}")
        for ch in (prefill, decode):
            wait_adapters(stubs, ch, {"poet"}, "after loading poet")
        status, models = get_json(port, "/v1/models")
        check({m["id"] for m in models["data"]} == {"stories260k", "sql", "poet"},
              f"/v1/models after load: {models}")
        check(complete(port, "poet", 24, PROMPT) == want["poet"], "runtime-loaded adapter differs")
        # sql was evicted on both workers: the router's request loads it on demand, on the
        # decode worker and on the prefill worker that computes the prompt.
        before = cluster_status(stubs, router).remote_prefills
        got = complete(port, "sql", 24, PROMPT2)
        check(got == want2, f"on-demand load: {got!r} != {want2!r}")
        check(cluster_status(stubs, router).remote_prefills == before + 1,
              "the on-demand request was not prefilled on the prefill worker")
        for ch in (prefill, decode):
            wait_adapters(stubs, ch, {"sql"}, f"after the on-demand load ({ch is decode and 'decode' or 'prefill'})")
        status, err = post_json(port, "/v1/load_lora_adapter",
                                {"lora_name": "bad", "lora_path": tmp + "/none"})
        check(status in (400, 404) and "not a directory" in err["error"]["message"],
              f"bad adapter load: {status} {err}")
        status, models = get_json(port, "/v1/models")
        check("bad" not in {m["id"] for m in models["data"]}, "a refused adapter is listed")
        print("ok: runtime load on the workers (evicting the least recently used), on-demand "
              "load of an evicted adapter, bad adapters refused")

        # The decode worker refuses what it cannot serve.
        wd, wp = stubs.worker_grpc.WorkerStub(decode), stubs.worker_grpc.WorkerStub(prefill)
        ids = list(range(5, 60))
        sampling = stubs.sampling.SamplingParams(temperature=0, max_tokens=8)
        finals = [m.final for m in wd.Decode(stubs.worker.DecodeRequest(
            request_id="lc-missing", prompt_token_ids=ids, sampling=sampling, n=1,
            lora_name="poet"), timeout=60) if m.HasField("final")]
        check(finals and finals[0].finish_reason == stubs.common.FINISH_REASON_ERROR and
              "'poet' is not loaded" in finals[0].error_message,
              f"an adapter the decode worker lacks: {finals}")
        sql_key = adapters(stubs, prefill)["sql"].cache_key
        # A base-model reservation, and a prefill worker computing its KV with sql.
        stream = wd.Decode(stubs.worker.DecodeRequest(
            request_id="lc-mismatch", prompt_token_ids=ids, sampling=sampling, n=1,
            remote_prefill=True, kv_lease_ms=30000), timeout=60)
        first = next(stream)
        check(first.HasField("reservation") and first.reservation.lora_cache_key == 0,
              f"no base reservation: {first}")
        target = stubs.worker.KvReservation()
        target.CopyFrom(first.reservation)
        try:
            wp.Prefill(stubs.worker.PrefillRequest(request_id="lc-mismatch", prompt_token_ids=ids,
                                                   sampling=sampling, n=1,
                                                   target=attempt_target(target, 0),
                                                   lora_name="sql"), timeout=60)
            check(False, "the prefill worker took a base-model reservation for sql")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                  "target.lora_cache_key" in e.details(), f"prefill refusal: {e}")
        # A sender that claims the reservation's adapter is sql: the decode worker refuses it.
        target.lora_cache_key = sql_key
        try:  # the transfer itself lands; what the decode worker does with it is the point
            wp.Prefill(stubs.worker.PrefillRequest(
                request_id="lc-mismatch", prompt_token_ids=ids, sampling=sampling, n=1,
                target=attempt_target(target, 1), lora_name="sql", attempt=1), timeout=60)
        except grpc.RpcError as e:
            print(f"note: the mismatched prefill call ended with {e.code()}")
        rest = list(stream)
        tokens = [t for m in rest if m.HasField("tokens") for t in m.tokens.token_ids]
        finals = [m.final for m in rest if m.HasField("final")]
        check(not tokens and finals and
              finals[0].finish_reason == stubs.common.FINISH_REASON_ERROR and
              "KV transfer refused" in finals[0].error_message and
              "the base model" in finals[0].error_message,
              f"a transfer for another adapter: tokens {tokens}, finals {finals}")
        # The cluster still serves (the refused KV joined no cache).
        check(complete(port, "stories260k", 24, PROMPT) == want["stories260k"],
              "base output after the refused transfer")
        print(f"ok: the decode worker refuses an adapter it lacks and a transfer for another "
              f"adapter ({finals[0].error_message!r})")

        # Unloading through the router unloads from the workers and stops serving the name,
        # though a worker's stats may still list it for a moment.
        status, _, body = post(port, "/v1/unload_lora_adapter", {"lora_name": "sql"})
        check(status == 200, f"unload: {status} {body!r}")
        status, err = post_json(port, "/v1/completions",
                                {"model": "sql", "prompt": PROMPT, "max_tokens": 4})
        check(status == 404, f"after unload: {status} {err}")
        status, models = get_json(port, "/v1/models")
        check({m["id"] for m in models["data"]} == {"stories260k", "poet"},
              f"/v1/models after unload: {models}")
        for ch in (prefill, decode):
            wait_adapters(stubs, ch, set(), "after unloading sql")
        print("ok: unloading through the router unloads on the workers")


if __name__ == "__main__":
    main()
