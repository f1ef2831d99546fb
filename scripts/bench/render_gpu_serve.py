"""Section: serving on one GPU, one process against 1P+1D over cuda-ipc
(scripts/bench/gpu_serve.sh)."""
import glob
import json
import os
import re

from benchfmt import commands_block, fmt, header, median, table, write

SERVERS = (("one-process", "one process (router + engine)"),
           ("cuda-ipc", "1 prefill + 1 decode process, KV over cuda-ipc"))


def _load(work):
    """{(server, concurrency): [report per round]} from <server>.c<C>.<round>.json."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(work, "*.c*.json"))):
        m = re.match(r"(.+)\.c(\d+)\.(\d+)\.json$", os.path.basename(path))
        if m:
            runs.setdefault((m.group(1), int(m.group(2))), []).append(json.load(open(path)))
    return runs


def render_gpu_serve(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    gpu = open(os.path.join(work, "gpu.txt")).read().strip()
    reps = int(open(os.path.join(work, "reps.txt")).read())
    preset = open(os.path.join(work, "preset.txt")).read().strip()
    runs = _load(work)
    md = header(work, "scripts/bench/gpu_serve.sh",
                "## Serving on one GPU: one process against prefill and decode processes",
                reps).replace("interleaved", "rounds of the whole sweep per server")
    md += (f"\nGPU: {gpu}. Random {preset} in bf16, `tandem serve --device cuda`, at most 64 "
           "sequences and 2048 tokens per step. For each concurrency C, one wave of C requests "
           "started together, 256-token prompts, 256 new tokens each (ignore_eos), greedy, each "
           "wave with its own prompts, after a warm-up. Aggregate tok/s = output tokens / wall "
           "time of the wave (prefill included); TTFT and ITL are the wave's medians; KV "
           "transfer is the server's median time to move a prompt's KV (cluster only). Each "
           "figure is the median of the rounds.\n\n")
    rows, summary = [], {}
    for server, label in SERVERS:
        for c in sorted({c for (s, c) in runs if s == server}):
            reports = runs[(server, c)]
            point = {
                "tok_s": median(r["throughput"]["output_tokens_per_s"] for r in reports),
                "ttft_p50_ms": median(r["ttft_ms"]["p50"] for r in reports),
                "itl_p50_ms": median(r["itl_ms"]["p50"] for r in reports),
                "kv_transfer_p50_ms": median(
                    r["server_ttft_split_ms"]["kv_transfer"]["p50"] for r in reports
                    if r["server_ttft_split_ms"]["remote"]),
                "failed": sum(r["requests"]["failed"] for r in reports),
            }
            summary[f"{server}.c{c}"] = point
            rows.append([label, c, fmt(point["tok_s"]), fmt(point["ttft_p50_ms"]),
                         fmt(point["itl_p50_ms"]), fmt(point["kv_transfer_p50_ms"]),
                         point["failed"]])
    md += table(["server", "C", "aggregate tok/s", "TTFT p50 (ms)", "ITL p50 (ms)",
                 "KV transfer p50 (ms)", "failed"], rows)
    md += "\n\n" + commands_block(work, tandem) + "\n"
    write(outdir, "gpu_serve", md, summary)
