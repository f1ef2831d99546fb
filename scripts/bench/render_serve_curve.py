"""Section: aggregate throughput and TTFT through `tandem serve` (scripts/bench/serve_curve.sh)."""
import glob
import json
import os
import re

from benchfmt import commands_block, fmt, header, median, spread, table, write

# llama.cpp server figures taken earlier on a machine of this type (2 threads, 128-token prompts,
# 128 new tokens), not side by side: aggregate tok/s at concurrency 1 / 4 / 8 and mean TTFT (ms)
# at concurrency 8.
PEER = {
    ("llama-1b", "int8"): ("q8_0", {1: 25.6, 4: 24.1, 8: 36.7}, 8400),
    ("llama-1b", "int4"): ("q4_0", {1: 39.6, 4: 48.2, 8: 59.2}, 5600),
    ("llama-110m", "none"): ("f32", {1: 94, 4: 136, 8: 195}, None),
}
NAMES = {"none": "bf16", "int8": "int8 (per-channel)", "int4": "int4 g128"}


def _load(work):
    """{(model, format, concurrency): {round: wave}} from <model>.<format>.c<C>.<round>.json."""
    runs = {}
    for path in glob.glob(os.path.join(work, "*.c*.json")):
        m = re.match(r"(.+)\.(none|int8|int4)\.c(\d+)\.(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        report = json.load(open(path))
        runs.setdefault((m.group(1), m.group(2), int(m.group(3))), {})[int(m.group(4))] = {
            "tok_s": report["throughput"]["output_tokens_per_s"],
            "ttft_mean_ms": report["ttft_ms"]["mean"],
            "completed": report["requests"]["completed"],
        }
    return runs


def _point(waves):
    """Medians over a point's rounds, with the rounds kept for the JSON summary."""
    if not waves:
        return None
    return {
        "tok_s": median(w["tok_s"] for w in waves.values()),
        "ttft_mean_ms": median(w["ttft_mean_ms"] for w in waves.values()),
        "rounds": [waves[r] for r in sorted(waves)],
    }


def _round_ratios(c1, c16):
    """c=16 / c=1 within each round: two waves a few seconds apart on one server."""
    if not c1 or not c16:
        return []
    return [c16[r]["tok_s"] / c1[r]["tok_s"] for r in sorted(c1)
            if r in c16 and c1[r]["tok_s"] > 0]


def render_serve_curve(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    runs = _load(work)
    reps = int(open(os.path.join(work, "reps.txt")).read())
    md = header(work, "scripts/bench/serve_curve.sh",
                "## Serving curve: aggregate throughput and TTFT through `tandem serve`",
                reps).replace("interleaved", "rounds of the whole sweep per server")
    md += ("\nOne `tandem serve` at a time (router and engine in one process, 2 compute "
           "threads, at most 32 sequences per step), weights quantized at load from the random "
           "bf16 checkpoint. Workload, as the peer's server figures: for each concurrency C, C "
           "requests started together, 128-token prompts, 128 new tokens each (ignore_eos), "
           "greedy; each wave draws its own prompts (a seed per wave: no prefix-cache hits), "
           "after a warm-up at the same shape. Aggregate tok/s = output tokens / wall time of "
           "the wave (prefill included); TTFT = mean time to first token of the wave. Each "
           "figure is the median of the rounds; c=16 / c=1 is the median of each round's own "
           "ratio (its two waves a few seconds apart on one server), with the rounds' range.\n")
    summary = {}
    for model in ("llama-110m", "llama-1b"):
        fmts = sorted({f for (m, f, _) in runs if m == model},
                      key=lambda f: ["none", "int8", "int4"].index(f))
        concs = sorted({c for (m, _, c) in runs if m == model})
        if not fmts:
            continue
        rows = []
        for f in fmts:
            point = {c: _point(runs.get((model, f, c))) for c in concs}
            row = [NAMES[f]] + [fmt(point[c]["tok_s"]) if point[c] else "-" for c in concs]
            ratios = _round_ratios(runs.get((model, f, 1)), runs.get((model, f, 16)))
            scale16 = median(ratios)
            row.append(f"{fmt(scale16)}x ({spread(ratios)})" if scale16 else "-")
            row += [fmt(point[c]["ttft_mean_ms"]) if point.get(c) else "-" for c in (1, 8)]
            peer = PEER.get((model, f))
            if peer:
                name, tps, ttft = peer
                ours = [point[c]["tok_s"] / tps[c] if point.get(c) else None for c in (1, 4, 8)]
                row.append(f"{name}: " + " / ".join(fmt(tps[c]) for c in (1, 4, 8)) + " ("
                           + " / ".join(f"{fmt(r)}x" if r else "-" for r in ours) + ")")
                row.append(f"{fmt(ttft)} ({fmt(ttft / point[8]['ttft_mean_ms'])}x faster)"
                           if ttft and point.get(8) else "-")
            else:
                row += ["-", "-"]
            rows.append(row)
            summary[f"{model}.{f}"] = {"points": point, "c16_over_c1": scale16,
                                       "c16_over_c1_rounds": ratios}
        md += f"\n### {model}\n\n"
        md += table(["weights"] + [f"c={c} tok/s" for c in concs]
                    + ["c=16 / c=1", "TTFT c=1 (ms)", "TTFT c=8 (ms)",
                       "peer tok/s c=1 / 4 / 8 (Tandem / peer)", "peer TTFT c=8 (ms)"], rows)
        md += "\n"
    md += ("\nThe peer figures are llama.cpp's server, taken earlier on a machine of this type; "
           "they are not re-run here, so the ratios compare runs made at different times.\n\n")
    md += commands_block(work, tandem) + "\n"
    write(outdir, "serve_curve", md, summary)
