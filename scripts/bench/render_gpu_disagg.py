"""Section: where splitting prefill from decode pays on one GPU -- one process against 1P+1D
over cuda-ipc, a wave of C requests and C decode streams under arriving long prompts
(scripts/bench/gpu_disagg.sh)."""
import glob
import json
import os
import re

from benchfmt import commands_block, fmt, header, median, table, write

SERVERS = (("one-process", "one process"),
           ("cuda-ipc", "1 prefill + 1 decode process, cuda-ipc"))


def _load(work, kind):
    """{(server, concurrency): [report per round]} from <server>.<kind>.c<C>.<round>.json."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(work, f"*.{kind}.c*.json"))):
        m = re.match(rf"(.+)\.{kind}\.c(\d+)\.(\d+)\.json$", os.path.basename(path))
        if m:
            runs.setdefault((m.group(1), int(m.group(2))), []).append(json.load(open(path)))
    return runs


def _ratio(a, b):
    return a / b if a is not None and b else None


def render_gpu_disagg(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    gpu = open(os.path.join(work, "gpu.txt")).read().strip()
    reps = int(open(os.path.join(work, "reps.txt")).read())
    preset = open(os.path.join(work, "preset.txt")).read().strip()
    mps = open(os.path.join(work, "mps.txt")).read().strip()
    p = json.load(open(os.path.join(work, "params.json")))
    waves, slos = _load(work, "wave"), _load(work, "slo")
    md = header(work, "scripts/bench/gpu_disagg.sh",
                "## Where splitting prefill from decode pays on one GPU",
                reps).replace("interleaved", "rounds per server")
    md += (f"\nGPU: {gpu}. MPS: {mps}. Random {preset} in bf16, `tandem serve --device cuda`, "
           "at most 64 sequences and 2048 tokens per step; the cluster is one prefill and one "
           "decode worker process on the same GPU, KV over cuda-ipc, every prompt prefilled "
           "remotely. Each figure is the median of the rounds.\n\n"
           f"**Wave**: C requests started together, {p['wave_len']}-token prompts, "
           f"{p['wave_len']} new tokens each (tandem bench).\n\n")
    rows, summary = [], {"wave": {}, "slo": {}}
    for server, label in SERVERS:
        for c in sorted({c for (s, c) in waves if s == server}):
            reports = waves[(server, c)]
            point = {
                "tok_s": median(r["throughput"]["output_tokens_per_s"] for r in reports),
                "ttft_p50_ms": median(r["ttft_ms"]["p50"] for r in reports),
                "itl_p50_ms": median(r["itl_ms"]["p50"] for r in reports),
                "itl_p99_ms": median(r["itl_ms"]["p99"] for r in reports),
                "kv_transfer_p50_ms": median(
                    r["server_ttft_split_ms"]["kv_transfer"]["p50"] for r in reports
                    if r["server_ttft_split_ms"]["remote"]),
                "failed": sum(r["requests"]["failed"] for r in reports),
            }
            summary["wave"][f"{server}.c{c}"] = point
            rows.append([label, c, fmt(point["tok_s"]), fmt(point["ttft_p50_ms"]),
                         fmt(point["itl_p50_ms"]), fmt(point["itl_p99_ms"]),
                         fmt(point["kv_transfer_p50_ms"]), point["failed"]])
    md += table(["server", "C", "aggregate tok/s", "TTFT p50 (ms)", "ITL p50 (ms)",
                 "ITL p99 (ms)", "KV transfer p50 (ms)", "failed"], rows)
    lines = []
    for c in sorted({c for (_, c) in waves}):
        one, split = summary["wave"].get(f"one-process.c{c}"), summary["wave"].get(f"cuda-ipc.c{c}")
        if one and split:
            r = _ratio(split["tok_s"], one["tok_s"])
            summary["wave"][f"tok_s_ratio.c{c}"] = r
            lines.append(f"C={c}: 1P+1D / one process tok/s = {fmt(r)} (goal >= 0.95)")
    md += "\n\n" + "; ".join(lines) + "\n\n" if lines else "\n\n"
    md += (f"**Long prompts during decode**: C decode streams (closed loop, "
           f"{p['decode_prompt']}-token prompts, {p['decode_output']} new tokens) while "
           f"{p['long_prompt']}-token prompts (16 new tokens) arrive at {p['long_rate']}/s "
           f"(Poisson) for {p['duration_s']} s (scripts/bench/slo_client.py). ITL is the "
           "decode streams'; a request is good when its TTFT <= "
           f"{p['ttft_slo_ms']} ms and its own ITL p99 <= {p['itl_slo_ms']} ms; goodput = good "
           "requests' output tokens per second.\n\n")
    rows = []
    for server, label in SERVERS:
        for c in sorted({c for (s, c) in slos if s == server}):
            reports = slos[(server, c)]
            point = {
                "itl_p50_ms": median(r["decode"]["itl_ms"]["p50"] for r in reports),
                "itl_p99_ms": median(r["decode"]["itl_ms"]["p99"] for r in reports),
                "itl_max_ms": median(r["decode"]["itl_ms"]["max"] for r in reports),
                "long_ttft_p50_ms": median(r["long"]["ttft_ms"]["p50"] for r in reports),
                "long_ttft_p99_ms": median(r["long"]["ttft_ms"]["p99"] for r in reports),
                "tok_s": median(r["output_tokens_per_s"] for r in reports),
                "goodput_tok_s": median(r["goodput_tokens_per_s"] for r in reports),
                "good_fraction": median(r["good_fraction"] for r in reports),
                "long_done": median(r["long"]["completed"] for r in reports),
                "failed": sum(r["failed"] for r in reports),
            }
            summary["slo"][f"{server}.c{c}"] = point
            rows.append([label, c, fmt(point["itl_p50_ms"]), fmt(point["itl_p99_ms"]),
                         fmt(point["itl_max_ms"]), fmt(point["long_ttft_p50_ms"]),
                         fmt(point["long_ttft_p99_ms"]), point["long_done"], fmt(point["tok_s"]),
                         fmt(point["goodput_tok_s"]), fmt(point["good_fraction"]),
                         point["failed"]])
    md += table(["server", "C", "ITL p50 (ms)", "**ITL p99 (ms)**", "ITL max (ms)",
                 "long TTFT p50 (ms)", "long TTFT p99 (ms)", "long prompts", "tok/s",
                 "**goodput tok/s**", "good share", "failed"], rows)
    lines = []
    for c in sorted({c for (_, c) in slos}):
        one, split = summary["slo"].get(f"one-process.c{c}"), summary["slo"].get(f"cuda-ipc.c{c}")
        if one and split:
            itl = _ratio(one["itl_p99_ms"], split["itl_p99_ms"])
            tput = _ratio(split["tok_s"], one["tok_s"])
            summary["slo"][f"itl_p99_ratio.c{c}"] = itl
            summary["slo"][f"tok_s_ratio.c{c}"] = tput
            lines.append(f"C={c}: ITL p99 one process / 1P+1D = **{fmt(itl)}** (goal >= 3 at the "
                         f"same throughput; 1P+1D / one process tok/s = {fmt(tput)})")
    md += "\n\n" + "; ".join(lines) + "\n" if lines else "\n"
    md += "\n" + commands_block(work, tandem) + "\n"
    write(outdir, "gpu_disagg", md, summary)
