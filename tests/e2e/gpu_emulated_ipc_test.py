#!/usr/bin/python3
"""The GPU serving path over CUDA IPC end to end without a GPU: the test-only emulation build
(scripts/build_emulated.sh: CUDA on the CPU emulator, whose exportable device memory another
process maps) runs `tandem serve --device cuda --kv-transport cuda-ipc --prefill-workers 1
--decode-workers 2`, every worker process on the one emulated GPU.
- greedy output of both bundled models on 12 concurrent prompts equals the CPU tcp cluster's bit
  for bit and the models' reference continuation;
- zero-copy (the default) and copying (`--kv-zero-copy off`) give the same outputs, and the
  zero-copy run never falls back to copying;
- `--kv-transport auto` resolves to cuda-ipc when the workers share the (emulated) GPU, which the
  workers advertise (WorkerInfo kv_transport, kv_device);
- cancellation during the transfer or mid-stream and SIGKILL of a decode worker with streams in
  flight lose nothing and leak no block; the restarted worker's pool is mapped afresh;
- at registration a router refuses cuda-ipc workers on two different (emulated) GPUs, naming both;
- workers started alone with `--kv-transport auto` speak both device transports ("nccl,cuda-ipc")
  and the router picks per pair: one prefill worker feeds a decode worker on its own GPU over
  cuda-ipc and one on another GPU over nccl (the prefill worker's send metrics by transport),
  with outputs equal to the CPU cluster's;
- fault injection (TANDEM_FAULTS kv_control_drop: a control message lost; kv_misplace: regions
  copied one block off) makes the output checks fail.
The checks are gpu_emulated_cluster_test's, run over cuda-ipc.

Usage: gpu_emulated_ipc_test.py BUILD_DIR   (the emulation binary: TANDEM_EMULATED_BUILD, or
BUILD_DIR/../build-emu)."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

import gpu_emulated_cluster_test as g  # noqa: E402
from tandem_testlib import (ROOT, Cluster, check, cluster_status, internal_channel,  # noqa: E402
                            kv_blocks_sent, load_stubs)

g.GPU = ["--device", "cuda", "--kv-transport", "cuda-ipc", "--num-kv-blocks", "512",
         "--matmul-input-dtype", "f32"] + g.REMOTE
log = g.log


def worker_infos(stubs, cluster):
    return [stubs.worker_grpc.WorkerStub(internal_channel(f"127.0.0.1:{port}")).GetInfo(
        stubs.worker.InfoRequest(), timeout=10)
        for lst in cluster.children().values() for _, port in lst]


def auto_is_cuda_ipc(stubs, emu_dir, cpu_outputs):
    """`--kv-transport auto` with every worker on the one emulated GPU runs cuda-ipc."""
    texts, want, ref = cpu_outputs["stories260k"]
    args = [a if a != "cuda-ipc" else "auto" for a in g.GPU]
    path = os.path.join(ROOT, "models", "stories260k")
    with Cluster(emu_dir, 1, 2, *args, model=path, startup_timeout=120) as gpu:
        got = g.served(stubs, gpu.address, texts[:4], g.TOKENS)
        infos = worker_infos(stubs, gpu)
        check(len(infos) == 3 and all(i.kv_transport == "cuda-ipc" for i in infos),
              f"auto resolved to cuda-ipc on every worker: {[i.kv_transport for i in infos]}")
        devices = {i.kv_device for i in infos}
        check(len(devices) == 1 and next(iter(devices)).startswith("GPU-"),
              f"every worker advertises the same GPU: {devices}")
        check("KV transport cuda-ipc (--kv-transport auto" in gpu.logs(),
              "serve says what auto resolved to")
        status = cluster_status(stubs, grpc.insecure_channel(gpu.address))
        check(status.remote_prefills >= 4 and status.failures == 0, f"remote prefills: {status}")
    check(got == want[:4], "auto (cuda-ipc) outputs equal the CPU cluster's")
    log(f"ok: --kv-transport auto on one emulated GPU runs cuda-ipc ({next(iter(devices))}), "
        f"outputs identical")


def zero_copy_and_copying_agree(stubs, emu_dir, cpu_outputs):
    """The same cluster zero-copy (the default, `--kv-zero-copy auto`: the prefill engine writes
    into the decode workers' mapped blocks) and copying (`--kv-zero-copy off`): outputs equal to
    each other and to the CPU cluster's, every prefill remote, and the zero-copy run never fell
    back to copying."""
    texts, want, _ = cpu_outputs["stories260k"]
    path = os.path.join(ROOT, "models", "stories260k")
    got = {}
    for mode in ("auto", "off"):
        with Cluster(emu_dir, 1, 2, *g.GPU, "--kv-zero-copy", mode, model=path,
                     startup_timeout=120) as gpu:
            got[mode] = g.served(stubs, gpu.address, texts, g.TOKENS)
            status = cluster_status(stubs, grpc.insecure_channel(gpu.address))
            check(status.remote_prefills >= len(texts) and status.failures == 0,
                  f"--kv-zero-copy {mode}: every prefill remote, none failed: {status}")
            if mode == "auto":
                check("not zero-copy" not in gpu.logs(),
                      "--kv-zero-copy auto on one GPU wrote the KV in place (no copying fallback)")
    check(got["auto"] == got["off"], "zero-copy and copying outputs are identical")
    check(got["auto"] == want, "zero-copy outputs equal the CPU cluster's")
    log(f"ok: --kv-zero-copy auto and off agree with each other and the CPU cluster "
        f"({len(texts)} prompts)")


def other_gpu_refused(emu_dir):
    """A cuda-ipc decode worker on another emulated GPU than the cluster's is refused at
    registration (the pair on one GPU is admitted)."""
    model = os.path.join(ROOT, "models", "stories260k")
    base = ["--model", model, "--device", "cuda", "--num-kv-blocks", "256",
            "--kv-transport", "cuda-ipc"]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            procs.append(g.Proc(emu_dir, tmp, "prefill", ["prefill"] + base,
                                env={"TANDEM_EMULATED_GPU": "gpu-a"}))
            procs.append(g.Proc(emu_dir, tmp, "decode", ["decode"] + base,
                                env={"TANDEM_EMULATED_GPU": "gpu-a"}))
            procs.append(g.Proc(emu_dir, tmp, "other-gpu", ["decode"] + base,
                                env={"TANDEM_EMULATED_GPU": "gpu-b"}))
            p, d, other = procs
            procs.append(g.Proc(emu_dir, tmp, "router", [
                "router", "--model", model, "--prefill-addresses", p.address,
                "--decode-addresses", f"{d.address},{other.address}"]))
            channel = grpc.insecure_channel(procs[-1].address)
            stubs = load_stubs()
            deadline = time.time() + 30
            while True:
                status = cluster_status(stubs, channel)
                if status.refused or time.time() > deadline:
                    break
                time.sleep(0.2)
            refused = list(status.refused)
            check(len(refused) == 1 and refused[0].startswith(other.address) and
                  "one GPU" in refused[0] and refused[0].count("GPU-") == 2,
                  f"cuda-ipc across two GPUs refused, naming both: {refused}")
            log(f"ok: refused at registration: {refused[0]}")
        finally:
            for proc in procs:
                proc.stop()


def auto_per_pair(stubs, emu_dir, cpu_outputs):
    """Workers started alone with `--kv-transport auto`: the router picks cuda-ipc for the pair on
    one GPU and nccl for the pair on two, and the outputs equal the CPU cluster's."""
    texts, want, _ = cpu_outputs["stories260k"]
    model = os.path.join(ROOT, "models", "stories260k")
    base = ["--model", model, "--device", "cuda", "--kv-transport", "auto", "--num-kv-blocks",
            "512", "--matmul-input-dtype", "f32"]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            metrics_file = os.path.join(tmp, "prefill.metrics-port")
            procs.append(g.Proc(emu_dir, tmp, "prefill", ["prefill"] + base + [
                "--metrics-port", "-1", "--metrics-port-file", metrics_file],
                env={"TANDEM_EMULATED_GPU": "gpu-a"}))
            procs.append(g.Proc(emu_dir, tmp, "decode-same", ["decode"] + base,
                                env={"TANDEM_EMULATED_GPU": "gpu-a"}))
            procs.append(g.Proc(emu_dir, tmp, "decode-other", ["decode"] + base,
                                env={"TANDEM_EMULATED_GPU": "gpu-b"}))
            p, same, other = procs
            infos = [stubs.worker_grpc.WorkerStub(internal_channel(x.address)).GetInfo(
                stubs.worker.InfoRequest(), timeout=10) for x in procs]
            check(all(i.kv_transport == "nccl,cuda-ipc" for i in infos),
                  f"auto on a GPU speaks both: {[i.kv_transport for i in infos]}")
            procs.append(g.Proc(emu_dir, tmp, "router", [
                "router", "--model", model, "--prefill-addresses", p.address,
                "--decode-addresses", f"{same.address},{other.address}"] + g.REMOTE))
            router = procs[-1]
            channel = grpc.insecure_channel(router.address)
            deadline = time.time() + 60
            while (sum(w.healthy for w in cluster_status(stubs, channel).workers) < 3 and
                   time.time() < deadline):
                time.sleep(0.2)
            status = cluster_status(stubs, channel)
            check(not status.refused, f"nothing refused: {list(status.refused)}")
            port = int(open(metrics_file).read())
            sent = {}
            for _ in range(4):  # until the router has placed requests on both decode workers
                got = g.served(stubs, router.address, texts, g.TOKENS)
                for i in range(len(texts)):
                    check(got[i] == want[i], f"prompt {i}: per-pair auto differs from the CPU "
                          f"cluster:\n{got[i]}\n{want[i]}")
                sent = kv_blocks_sent(port)
                if sent.get("cuda-ipc", 0) > 0 and sent.get("nccl", 0) > 0:
                    break
            check(sent.get("cuda-ipc", 0) > 0 and sent.get("nccl", 0) > 0,
                  f"KV sent over cuda-ipc (same GPU) and nccl (other GPU): {sent}")
            status = cluster_status(stubs, channel)
            check(status.failures == 0 and status.prefill_retries == 0, f"no failure: {status}")
            log(f"ok: auto per pair: cuda-ipc to the decode worker on the prefill worker's GPU, "
                f"nccl to the one on another (blocks sent {sent}); outputs identical")
        finally:
            for proc in procs:
                proc.stop()


def main():
    build_dir = os.path.abspath(sys.argv[1])
    emu_dir = os.environ.get("TANDEM_EMULATED_BUILD", os.path.join(build_dir, "..", "build-emu"))
    check(os.path.exists(os.path.join(emu_dir, "bin", "tandem")),
          f"no emulation build at {emu_dir}: run scripts/build_emulated.sh")
    out = subprocess.run([os.path.join(emu_dir, "bin", "tandem"), "--version"], check=True,
                         capture_output=True, text=True).stdout
    check("GPU EMULATION BUILD" in out and "cuda-ipc" in out, f"not the emulation build: {out}")
    stubs = load_stubs()
    other_gpu_refused(emu_dir)
    cpu_outputs = g.outputs_match(stubs, build_dir, emu_dir)
    auto_is_cuda_ipc(stubs, emu_dir, cpu_outputs)
    zero_copy_and_copying_agree(stubs, emu_dir, cpu_outputs)
    auto_per_pair(stubs, emu_dir, cpu_outputs)
    g.faults_are_caught(stubs, emu_dir, cpu_outputs)
    g.faults(stubs, emu_dir, tokens=80)
    print("PASS")


if __name__ == "__main__":
    main()
