#!/usr/bin/python3
"""The real (not emulated) GPU serving paths, one verdict line each, for tests/gpu/run.sh:
- nccl startup: `tandem prefill --device cuda --kv-transport nccl` starts on this GPU;
- nccl cluster: prefill on cuda:0 and decode on cuda:1 over NCCL, 12 concurrent greedy prompts
  equal to the CPU tcp cluster's bit for bit (needs two GPUs: NCCL refuses two ranks on one);
- auto per pair: with two GPUs, workers started alone with `--kv-transport auto` (prefill and
  one decode worker on cuda:0, another decode worker on cuda:1): the router picks cuda-ipc for
  the pair on one GPU and nccl for the other, outputs equal to the CPU tcp cluster's;
- cuda-ipc cluster: `tandem serve --device cuda --kv-transport auto --prefill-workers 1
  --decode-workers 2` (auto resolves to cuda-ipc: every worker process on this one GPU), 12
  concurrent greedy prompts equal to the CPU tcp cluster's bit for bit, every prompt prefilled
  remotely without a failure;
- cuda-ipc models, faults, kill: the emulated GPU cluster tests' checks on this GPU over
  cuda-ipc (gpu_emulated_cluster_test.py): both bundled models' 12 concurrent greedy outputs
  equal the CPU tcp cluster's and the reference with no block leaked; TANDEM_FAULTS (a control
  message lost, a copy one block off) makes those checks fail; streams cancelled during their
  transfer or mid-stream and a decode worker SIGKILLed with streams in flight lose nothing and
  leak no block.

Usage: gpu_cluster_check.py BUILD_DIR   (a CUDA build holding bin/tandem). Exit 1 on a FAIL."""
import os
import subprocess

import grpc
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

import gpu_emulated_cluster_test as g  # noqa: E402
from gpu_emulated_cluster_test import CPU, Proc, prompts, served  # noqa: E402
from tandem_testlib import (ROOT, Cluster, cluster_status, kv_blocks_sent,  # noqa: E402
                            load_stubs)

TOKENS = 48


def gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return 0
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


_CPU_OUTPUTS = {}


def cpu_outputs(stubs, build_dir, model):
    """The model's 12 prompts and the CPU tcp cluster's greedy outputs (served once per model; they
    do not depend on the cluster's shape)."""
    if model not in _CPU_OUTPUTS:
        _, texts = prompts(os.path.basename(model))
        with Cluster(build_dir, 1, 2, *CPU, model=model) as cpu:
            _CPU_OUTPUTS[model] = (texts, served(stubs, cpu.address, texts, TOKENS))
    return _CPU_OUTPUTS[model]


def verdict(name, outcome, why):
    print(f"VERDICT {name}: {outcome} {why}", flush=True)
    return outcome != "FAIL"


def main():
    build_dir = os.path.abspath(sys.argv[1])
    stubs = load_stubs()
    model = os.path.join(ROOT, "models", "stories260k")
    n = gpus()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        try:
            p = Proc(build_dir, tmp, "prefill", ["prefill", "--model", model, "--device", "cuda",
                                                 "--kv-transport", "nccl"])
            p.stop()
            ok &= verdict("nccl startup", "PASS", "(prefill worker on cuda:0 with nccl)")
        except AssertionError as e:
            ok &= verdict("nccl startup", "FAIL", str(e)[-400:])
    if n < 2:
        verdict("nccl cluster", "SKIP", f"({n} GPU visible; NCCL needs prefill and decode on two)")
    else:
        texts, want = cpu_outputs(stubs, build_dir, model)
        gpu_args = ["--model", model, "--kv-transport", "nccl", "--matmul-input-dtype", "f32"]
        with tempfile.TemporaryDirectory() as tmp:
            procs = []
            try:
                procs.append(Proc(build_dir, tmp, "prefill",
                                  ["prefill", "--device", "cuda:0"] + gpu_args))
                procs.append(Proc(build_dir, tmp, "decode",
                                  ["decode", "--device", "cuda:1"] + gpu_args))
                procs.append(Proc(build_dir, tmp, "router", [
                    "router", "--model", model, "--disagg-min-uncached-tokens", "0",
                    "--prefill-addresses", procs[0].address,
                    "--decode-addresses", procs[1].address]))
                time.sleep(2)  # registration
                got = served(stubs, procs[2].address, texts, TOKENS)
                same = sum(g == w for g, w in zip(got, want))
                ok &= verdict("nccl cluster", "PASS" if same == len(texts) else "FAIL",
                              f"({same}/{len(texts)} greedy outputs equal the CPU tcp cluster's)")
            except AssertionError as e:
                ok &= verdict("nccl cluster", "FAIL", str(e)[-400:])
            finally:
                for proc in procs:
                    proc.stop()
    if n < 2:
        verdict("auto per pair", "SKIP", f"({n} GPU visible; needs two)")
    else:
        ok &= auto_per_pair(stubs, build_dir, model)
    if n < 1:
        verdict("cuda-ipc cluster", "SKIP", "(no GPU visible)")
    else:
        ok &= cuda_ipc_cluster(stubs, build_dir, model)
        ok &= cuda_ipc_checks(stubs, build_dir)
    return 0 if ok else 1


def cuda_ipc_checks(stubs, build_dir):
    """The emulated GPU cluster tests' checks, on this GPU over cuda-ipc."""
    g.GPU = ["--device", "cuda", "--kv-transport", "cuda-ipc", "--num-kv-blocks", "512",
             "--matmul-input-dtype", "f32"] + g.REMOTE
    ok = True
    try:
        outputs = g.outputs_match(stubs, build_dir, build_dir, emulated=False)
        ok &= verdict("cuda-ipc models", "PASS", f"({', '.join(g.MODELS)}: 12 concurrent greedy "
                      "outputs each equal the CPU tcp cluster's and the reference, no block leaked)")
    except (AssertionError, RuntimeError) as e:
        return verdict("cuda-ipc models", "FAIL", str(e)[-400:])
    try:
        g.faults_are_caught(stubs, build_dir, outputs, emulated=False)
        ok &= verdict("cuda-ipc faults", "PASS", "(a lost control message and a copy one block off "
                      "each make the output checks fail)")
    except (AssertionError, RuntimeError) as e:
        ok &= verdict("cuda-ipc faults", "FAIL", str(e)[-400:])
    try:
        g.faults(stubs, build_dir, tokens=80)
        ok &= verdict("cuda-ipc kill", "PASS", "(cancellation during the transfer and mid-stream, "
                      "SIGKILL of a decode worker with 8 streams in flight: nothing lost, no block "
                      "leaked, the restarted worker fed afresh)")
    except (AssertionError, RuntimeError) as e:
        ok &= verdict("cuda-ipc kill", "FAIL", str(e)[-400:])
    return ok


def auto_per_pair(stubs, build_dir, model):
    """`--kv-transport auto` workers started alone: cuda-ipc to the decode worker on the prefill
    worker's GPU, nccl to the one on the other GPU."""
    texts, want = cpu_outputs(stubs, build_dir, model)
    args = ["--model", model, "--kv-transport", "auto", "--matmul-input-dtype", "f32"]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            metrics_file = os.path.join(tmp, "prefill.metrics-port")
            procs.append(Proc(build_dir, tmp, "prefill", ["prefill", "--device", "cuda:0"] + args +
                              ["--metrics-port", "-1", "--metrics-port-file", metrics_file]))
            procs.append(Proc(build_dir, tmp, "decode0", ["decode", "--device", "cuda:0"] + args))
            procs.append(Proc(build_dir, tmp, "decode1", ["decode", "--device", "cuda:1"] + args))
            procs.append(Proc(build_dir, tmp, "router", [
                "router", "--model", model, "--disagg-min-uncached-tokens", "0",
                "--prefill-addresses", procs[0].address,
                "--decode-addresses", f"{procs[1].address},{procs[2].address}"]))
            time.sleep(2)  # registration
            got = served(stubs, procs[3].address, texts, TOKENS)
            got += served(stubs, procs[3].address, texts, TOKENS)
            same = sum(g == w for g, w in zip(got, want + want))
            sent = kv_blocks_sent(int(open(metrics_file).read()))
            both = sent.get("cuda-ipc", 0) > 0 and sent.get("nccl", 0) > 0
            return verdict("auto per pair", "PASS" if same == len(got) and both else "FAIL",
                           f"({same}/{len(got)} greedy outputs equal the CPU tcp cluster's; KV "
                           f"blocks sent per transport {sent})")
        except (AssertionError, RuntimeError, OSError) as e:
            return verdict("auto per pair", "FAIL", str(e)[-400:])
        finally:
            for proc in procs:
                proc.stop()


def cuda_ipc_cluster(stubs, build_dir, model):
    """Prefill and decode processes on one GPU over CUDA IPC (auto resolves to it in serve)."""
    try:
        texts, want = cpu_outputs(stubs, build_dir, model)
        args = ["--device", "cuda", "--kv-transport", "auto", "--num-kv-blocks", "512",
                "--matmul-input-dtype", "f32", "--disagg-min-uncached-tokens", "0"]
        with Cluster(build_dir, 1, 2, *args, model=model, startup_timeout=180) as gpu:
            if "KV transport cuda-ipc" not in gpu.logs():
                return verdict("cuda-ipc cluster", "FAIL", "(auto did not resolve to cuda-ipc)")
            got = served(stubs, gpu.address, texts, TOKENS)
            status = cluster_status(stubs, grpc.insecure_channel(gpu.address))
        same = sum(g == w for g, w in zip(got, want))
        remote = status.remote_prefills >= len(texts) and status.failures == 0
        return verdict("cuda-ipc cluster", "PASS" if same == len(texts) and remote else "FAIL",
                       f"({same}/{len(texts)} greedy outputs equal the CPU tcp cluster's; "
                       f"{status.remote_prefills} remote prefills, {status.failures} failures)")
    except (AssertionError, RuntimeError) as e:
        return verdict("cuda-ipc cluster", "FAIL", str(e)[-400:])


if __name__ == "__main__":
    sys.exit(main())
