"""Section: memory bandwidth and batch-1 decode (scripts/bench/decode_bandwidth.sh)."""
import glob
import json
import os
import re
import struct

from benchfmt import commands_block, fmt, header, median, pct, spread, table, write


def safetensors_bytes_per_token(model_dir):
    """Weight bytes read per decoded token: every tensor once, except an untied input
    embedding (only one row of it is read)."""
    sizes = {}
    for path in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            for name, info in json.loads(f.read(n)).items():
                if name != "__metadata__":
                    sizes[name] = info["data_offsets"][1] - info["data_offsets"][0]
    total = sum(sizes.values())
    if "lm_head.weight" in sizes:
        total -= sizes.get("model.embed_tokens.weight", 0)
    return total


def _membw(work, threads):
    med, best = [], []
    for p in sorted(glob.glob(os.path.join(work, f"membw.t{threads}.*.txt"))):
        text = open(p).read()
        best.append(float(re.search(r"best ([\d.]+) GB/s", text).group(1)))
        med.append(float(re.search(r"median ([\d.]+) GB/s", text).group(1)))
    return med, best


def render_decode_bandwidth(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    thread_counts = sorted({int(m.group(1)) for p in glob.glob(os.path.join(work, "membw.t*"))
                            for m in [re.search(r"membw\.t(\d+)\.", p)]})
    models = [line.split() for line in open(os.path.join(work, "models.txt"))]
    summary, bw_rows, rows = {}, [], []
    for t in thread_counts:
        med, best = _membw(work, t)
        bw = median(med)
        bw_rows.append([t, fmt(bw), spread(med), fmt(median(best))])
        summary[f"membw_t{t}"] = {"median_gbps": bw, "runs": med, "best": best}
        for name, model_dir, tokens in models:
            rates = []
            for p in sorted(glob.glob(os.path.join(work, f"generate.{name}.t{t}.*.log"))):
                m = re.search(r"decode ([\d.]+) tokens/s", open(p).read())
                rates.append(float(m.group(1)) if m else None)
            rate = median(rates)
            per_token = safetensors_bytes_per_token(model_dir)
            streamed = per_token * rate / 1e9 if rate else None
            roof = bw * 1e9 / per_token if bw else None
            frac = streamed / bw if streamed and bw else None
            rows.append([name, t, f"{per_token / 1e6:.0f} MB", fmt(rate), spread(rates),
                         fmt(streamed), fmt(bw), pct(frac), fmt(roof)])
            summary[f"{name}_t{t}"] = {"bytes_per_token": per_token, "tokens": int(tokens),
                                       "decode_tokens_per_s": rate, "runs": rates,
                                       "streamed_gbps": streamed, "membw_gbps": bw,
                                       "fraction_of_bandwidth": frac,
                                       "roofline_tokens_per_s": roof}
    reps = len(_membw(work, thread_counts[0])[0]) if thread_counts else 0
    md = header(work, "scripts/bench/decode_bandwidth.sh",
                "## Decode is memory-bound: bandwidth and batch-1 decode", reps)
    md += "\nMemory read bandwidth (`membw`, 1 GiB buffer):\n\n"
    md += table(["threads", "GB/s (median of the runs' medians)", "runs", "best run"], bw_rows)
    md += "\n\nBatch-1 decode of the random bf16 models (`tandem generate`, greedy, `--ignore-eos`):\n\n"
    md += table(["model", "threads", "weights read / token", "decode tok/s (median)", "runs",
                 "weights streamed GB/s", "membw GB/s (same threads)", "of bandwidth",
                 "roofline tok/s"], rows)
    md += ("\n\nWeights read per token = every tensor of the safetensors files once (the "
           "input embedding is left out when the LM head is a separate tensor: decode reads one "
           "row of it); KV reads are negligible at these lengths. Decode tokens/s is "
           "`tandem generate`'s own figure (first token to last). Streamed GB/s = bytes per "
           "token x tokens/s, compared with `membw` at the same thread count; the roofline is "
           "bandwidth / bytes per token.\n\n")
    md += commands_block(work, tandem) + "\n"
    write(outdir, "decode_bandwidth", md, summary)
