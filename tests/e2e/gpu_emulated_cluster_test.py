#!/usr/bin/python3
"""The GPU serving path end to end without a GPU: the test-only emulation build
(scripts/build_emulated.sh: the CUDA backend and NCCL on the CPU emulator) runs
`tandem serve --device cuda --kv-transport nccl --prefill-workers 1 --decode-workers 2` (the
emulation build gives each worker of an nccl cluster its own emulated GPU: NCCL refuses two ranks
on one GPU).
- greedy output of both bundled models on 12 concurrent prompts equals the CPU tcp cluster's bit
  for bit, and the models' reference continuation;
- cancellation during the KV transfer or mid-stream, and SIGKILL of a decode worker with streams
  in flight, lose nothing and leak no block; the restarted worker is fed over a new communicator;
- at registration a router refuses a decode worker on another transport, an nccl one on the
  prefill worker's own GPU (NCCL refuses two ranks on one GPU) and one with another KV
  layout, naming both sides / the field;
- fault injection (TANDEM_FAULTS kv_control_drop, kv_misplace) makes the output checks fail.

Usage: gpu_emulated_cluster_test.py BUILD_DIR   (the emulation binary: TANDEM_EMULATED_BUILD, or
BUILD_DIR/../build-emu)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

from tandem_testlib import (ROOT, Cluster, check, cluster_status, load_stubs,  # noqa: E402
                            wait_no_leaks, with_kv_secret)

MODELS = ("stories260k", "llama2xs-280k")
# Every prompt is prefilled on the prefill worker and its KV shipped (none prefilled locally).
REMOTE = ["--disagg-min-uncached-tokens", "0"]
GPU = ["--device", "cuda", "--kv-transport", "nccl", "--num-kv-blocks", "512",
       "--matmul-input-dtype", "f32"] + REMOTE
CPU = ["--kv-transport", "tcp", "--matmul-input-dtype", "f32"] + REMOTE
TOKENS = 48


def transport():
    """The KV transport the emulated GPU cluster runs (GPU's --kv-transport; a sibling test runs
    these checks over cuda-ipc)."""
    return GPU[GPU.index("--kv-transport") + 1]


def prompts(model):
    ref = json.load(open(os.path.join(ROOT, "models", model, "reference", "once_upon_a_time.json")))
    names = ["Lily", "Tom", "Max", "Sue", "Ben", "Mia", "Sam", "Zoe", "Tim", "Ann", "Bob"]
    return ref, [ref["prompt"]] + [f"Once upon a time there was a child named {n}" for n in names]


def run_all(stubs, address, texts, max_tokens, progress=None):
    """Every prompt at once, greedy; returns [(ids, final or RpcError)]."""
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))
    results = [None] * len(texts)

    def one(i):
        ids, final = [], None
        try:
            for r in stub.Generate(stubs.gen.GenerateRequest(
                    text=texts[i], sampling=stubs.sampling.SamplingParams(
                        temperature=0, max_tokens=max_tokens, ignore_eos=True)), timeout=300):
                if r.HasField("chunk"):
                    ids.extend(r.chunk.token_ids)
                    if progress is not None:
                        progress[i] = len(ids)
                else:
                    final = r.final
        except grpc.RpcError as e:
            final = e
        results[i] = (ids, final)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    return threads, results


def served(stubs, address, texts, max_tokens):
    threads, results = run_all(stubs, address, texts, max_tokens)
    for t in threads:
        t.join()
    for i, (ids, final) in enumerate(results):
        check(not isinstance(final, grpc.RpcError), f"prompt {i} failed: {final}")
    return [ids for ids, _ in results]


T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:.0f}s] {msg}", flush=True)


def check_emulated(emu_dir):
    out = subprocess.run([os.path.join(emu_dir, "bin", "tandem"), "--version"], check=True,
                         capture_output=True, text=True).stdout
    check("GPU EMULATION BUILD" in out and "nccl" in out, f"not the emulation build: {out}")


def cluster_check(stubs, binary_dir, model, texts, want, ref, env=None, emulated=True):
    """One run of the GPU cluster (GPU's arguments; the emulation build unless `emulated` is
    false) on `texts`; raises AssertionError unless every output equals `want` (the CPU
    cluster's) and the reference, every prompt was prefilled remotely over transport() without a
    failure, and no worker holds anything afterwards."""
    path = os.path.join(ROOT, "models", model)
    kind = "emulated GPU" if emulated else "GPU"
    with Cluster(binary_dir, 1, 2, *GPU, model=path, env=env, startup_timeout=120) as gpu:
        if emulated:
            check("GPU EMULATION BUILD" in gpu.logs(), "the workers announce the emulation build")
        got = served(stubs, gpu.address, texts, TOKENS)
        status = cluster_status(stubs, grpc.insecure_channel(gpu.address))
        check(status.remote_prefills >= len(texts) and status.local_prefills == 0 and
              status.prefill_retries == 0 and status.failures == 0,
              f"every prompt prefilled remotely, its KV over {transport()} at the first try: "
              f"{status}")
        channels = [c for lst in gpu.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels)
    for i in range(len(texts)):
        check(got[i] == want[i], f"{model} prompt {i}: {kind} cluster ({transport()}) "
              f"differs from the CPU cluster (tcp):\n{got[i]}\n{want[i]}")
    n = min(TOKENS, len(ref["generated_ids"]))
    check(got[0][:n] == ref["generated_ids"][:n], f"{model}: reference differs: {got[0]}")


def outputs_match(stubs, build_dir, gpu_dir, emulated=True):
    """Returns {model: (texts, the CPU cluster's outputs, reference)}."""
    out = {}
    for model in MODELS:
        ref, texts = prompts(model)
        with Cluster(build_dir, 1, 2, *CPU, model=os.path.join(ROOT, "models", model)) as cpu:
            want = served(stubs, cpu.address, texts, TOKENS)
        cluster_check(stubs, gpu_dir, model, texts, want, ref, emulated=emulated)
        log(f"ok: {model}: {len(texts)} concurrent greedy outputs over {transport()}"
            f"{' (emulated)' if emulated else ''} equal the CPU tcp cluster's and the reference")
        out[model] = (texts, want, ref)
    return out


def faults_are_caught(stubs, gpu_dir, cpu_outputs, emulated=True):
    """The checks above fail when the transport loses a control message or puts a transfer in the
    wrong block (TANDEM_FAULTS, the device transports' fault injection): they are not vacuous."""
    texts, want, ref = cpu_outputs["stories260k"]
    for spec in ("kv_control_drop=1", "kv_misplace=1"):
        try:
            cluster_check(stubs, gpu_dir, "stories260k", texts[:4], want[:4], ref,
                          env={"TANDEM_FAULTS": spec + ",seed=1"}, emulated=emulated)
        except AssertionError as e:
            log(f"ok: with TANDEM_FAULTS={spec} the checks fail: {str(e).splitlines()[0][:160]}")
            continue
        raise AssertionError(f"the checks passed although TANDEM_FAULTS={spec}")


def cancel_streams(stubs, address, texts, wait_tokens):
    """Starts a stream per prompt and cancels each once it has `wait_tokens` tokens (0: at once,
    while its prefill or KV transfer may be in flight)."""
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))
    calls = [stub.Generate(stubs.gen.GenerateRequest(
        text=t, sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=400,
                                                       ignore_eos=True)), timeout=120)
             for t in texts]
    for call in calls:
        got = 0
        try:
            for r in call:
                if r.HasField("chunk"):
                    got += len(r.chunk.token_ids)
                if got >= wait_tokens:
                    break
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.CANCELLED, f"stream ended with {e.code()}")
        call.cancel()


def faults(stubs, emu_dir, tokens=160):
    """Cancellation and SIGKILL of a decode worker with streams of `tokens` tokens in flight."""
    path = os.path.join(ROOT, "models", "stories260k")
    _, texts = prompts("stories260k")
    texts = texts[:8]
    # round_robin: the restarted decode worker gets its share (prefix affinity would send the
    # repeated prompts to the worker that cached them).
    with Cluster(emu_dir, 1, 2, *GPU, "--routing-policy", "round_robin", model=path,
                 startup_timeout=120) as gpu:
        want = served(stubs, gpu.address, texts, tokens)
        channel = grpc.insecure_channel(gpu.address)
        channels = [c for lst in gpu.worker_channels().values() for c in lst]

        # Cancellation at once (prefill / KV transfer in flight) and mid-stream frees everything.
        cancel_streams(stubs, gpu.address, texts, 0)
        cancel_streams(stubs, gpu.address, texts, 5)
        wait_no_leaks(stubs, channels, timeout=60)
        log(f"ok: {2 * len(texts)} streams cancelled during their transfer or mid-stream: "
              f"no block leaked")
        progress = [0] * len(texts)
        threads, results = run_all(stubs, gpu.address, texts, tokens, progress)
        deadline = time.time() + 120
        while min(progress) < 8 and time.time() < deadline:
            time.sleep(0.02)
        check(min(progress) >= 8, f"streams did not start: {progress}")
        lives = {w.incarnation for w in cluster_status(stubs, channel).workers}
        victim = gpu.children()["decode"][0][0]
        log(f"killing decode worker {victim}")
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join()
        for i, (ids, final) in enumerate(results):
            check(not isinstance(final, grpc.RpcError), f"stream {i} failed after the kill: {final}")
            check(ids == want[i], f"stream {i} differs from the undisturbed run after the kill")
        # The supervisor restarts the killed worker (a new incarnation): nothing leaks anywhere,
        # and the prefill worker reaches the new incarnation over a new communicator.
        deadline = time.time() + 120
        while time.time() < deadline:
            status = cluster_status(stubs, channel)
            healthy = [w for w in status.workers if w.role == "decode" and w.healthy]
            restarted = [w for w in healthy if w.incarnation not in lives]
            if restarted and len(healthy) == 2:
                break
            time.sleep(0.2)
        check(restarted and len(healthy) == 2, f"the killed decode worker is back: {status}")
        log("the killed decode worker is back")
        channels = [c for lst in gpu.worker_channels().values() for c in lst]
        wait_no_leaks(stubs, channels, timeout=60)
        before = cluster_status(stubs, channel)
        again = served(stubs, gpu.address, texts * 2, tokens)
        after = cluster_status(stubs, channel)
        check(again == want * 2, "after the restart, outputs are identical")
        routed = {w.address: w.routed_requests for w in after.workers
                  if w.role == "decode" and w.healthy}
        was = {w.address: w.routed_requests for w in before.workers if w.role == "decode"}
        check(all(routed[a] > was.get(a, 0) for a in routed),
              f"both decode workers (one restarted) take requests: {was} -> {routed}")
        check(after.remote_prefills - before.remote_prefills == 2 * len(texts) and
              after.failures == before.failures,
              f"prefilled remotely over {transport()}: {after}")
        wait_no_leaks(stubs, channels, timeout=60)
        log(f"ok: SIGKILL of decode worker {victim} with {len(texts)} streams in flight: every "
              f"stream complete and identical, no block leaked; the restarted worker is fed "
              f"afresh over {transport()}")


class Proc:
    def __init__(self, binary_dir, tmp, name, args, env=None):
        self.name = name
        port_file = os.path.join(tmp, name + ".port")
        self.log_path = os.path.join(tmp, name + ".log")
        self.proc = subprocess.Popen([os.path.join(binary_dir, "bin", "tandem")] +
                                     with_kv_secret(args) +
                                     ["--port", "0", "--port-file", port_file],
                                     stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            check(self.proc.poll() is None, f"{name} exited: {open(self.log_path).read()}")
            check(time.time() < deadline, f"{name} did not start")
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(port_file).read().strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def mismatches_refused(stubs, emu_dir):
    model = os.path.join(ROOT, "models", "stories260k")
    base = ["--model", model, "--device", "cuda", "--num-kv-blocks", "256"]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            # NCCL needs each rank on its own GPU: the prefill and decode workers get one each.
            procs.append(Proc(emu_dir, tmp, "prefill", ["prefill", "--kv-transport", "nccl"] + base,
                              env={"TANDEM_EMULATED_GPU": "gpu-p"}))
            procs.append(Proc(emu_dir, tmp, "decode", ["decode", "--kv-transport", "nccl"] + base,
                              env={"TANDEM_EMULATED_GPU": "gpu-d"}))
            procs.append(Proc(emu_dir, tmp, "bad-layout", ["decode", "--kv-transport", "nccl",
                                                           "--block-size", "32"] + base,
                              env={"TANDEM_EMULATED_GPU": "gpu-l"}))
            # tcp needs the engine on the CPU (same model, same KV layout: only the transport
            # differs).
            procs.append(Proc(emu_dir, tmp, "bad-transport", ["decode", "--kv-transport", "tcp",
                                                              "--model", model]))
            # nccl on the prefill worker's own GPU: NCCL would refuse the pair's communicator.
            procs.append(Proc(emu_dir, tmp, "same-gpu", ["decode", "--kv-transport", "nccl"] + base,
                              env={"TANDEM_EMULATED_GPU": "gpu-p"}))
            p, d, bad_layout, bad_transport, same_gpu = procs
            procs.append(Proc(emu_dir, tmp, "router", [
                "router", "--model", model, "--prefill-addresses", p.address,
                "--decode-addresses", ",".join(
                    x.address for x in (d, bad_layout, bad_transport, same_gpu))]))
            channel = grpc.insecure_channel(procs[-1].address)
            deadline = time.time() + 30
            while True:
                status = cluster_status(stubs, channel)
                if len(status.refused) >= 3 or time.time() > deadline:
                    break
                time.sleep(0.2)
            refused = list(status.refused)
            layout = [r for r in refused if r.startswith(bad_layout.address)]
            check(layout and "block_size" in layout[0], f"layout mismatch refused: {refused}")
            transport = [r for r in refused if "KV transport mismatch" in r]
            check(transport and "'tcp'" in transport[0] and "'nccl'" in transport[0] and
                  bad_transport.address in transport[0], f"transport mismatch refused: {refused}")
            one_gpu = [r for r in refused if r.startswith(same_gpu.address)]
            check(one_gpu and "different GPUs" in one_gpu[0] and p.address in one_gpu[0],
                  f"an nccl pair on one GPU refused: {refused}")
            check(len(refused) == 3, f"only the three bad workers refused: {refused}")
            log(f"ok: refused at registration: {layout[0]}")
            log(f"ok: refused at registration: {transport[0]}")
            log(f"ok: refused at registration: {one_gpu[0]}")
        finally:
            for proc in procs:
                proc.stop()


def main():
    build_dir = os.path.abspath(sys.argv[1])
    emu_dir = os.environ.get("TANDEM_EMULATED_BUILD", os.path.join(build_dir, "..", "build-emu"))
    check(os.path.exists(os.path.join(emu_dir, "bin", "tandem")),
          f"no emulation build at {emu_dir}: run scripts/build_emulated.sh")
    stubs = load_stubs()
    check_emulated(emu_dir)
    mismatches_refused(stubs, emu_dir)
    cpu_outputs = outputs_match(stubs, build_dir, emu_dir)
    faults_are_caught(stubs, emu_dir, cpu_outputs)
    faults(stubs, emu_dir)
    print("PASS")


if __name__ == "__main__":
    main()
