#!/usr/bin/python3
"""PNG plots of the quantization and serving figures from the sections' JSON (docs/benchmarks/*.json), next to it:

  serve_curve.png    aggregate tok/s and mean TTFT vs concurrency through `tandem serve`, per model
                     and weight format, with the peer's server figures
  decode_batch.png   llama-1b / llama-110m decode tok/s vs batch (1, 8, 16, 32) per weight format
                     and matmul inputs (quant_bench), with the peer's batch-1 and batch-8 figures
  roofline.png       batch-1 decode as a fraction of the memory roofline, per format and inputs,
                     with the 85% goal

  plots.py RESULTS_DIR          (needs matplotlib: apt-get install python3-matplotlib)
Run by scripts/bench/run_all.sh after the quantization and serve_curve sections.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import PEER as QUANT_PEER  # noqa: E402
from render_serve_curve import PEER as SERVE_PEER  # noqa: E402

FORMAT = {"none": "bf16", "int8": "int8", "int4": "int4"}


def load(results, name):
    path = os.path.join(results, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def serve_curve(data, out):
    models = sorted({k.split(".")[0] for k in data}, key=lambda m: m != "llama-110m")
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        tput, ttft = axes[0][col], axes[1][col]
        for key, run in sorted(data.items()):
            m, quant = key.split(".")
            if m != model:
                continue
            cs = sorted(int(c) for c in run["points"])
            pts = [run["points"][str(c)] for c in cs]
            line, = tput.plot(cs, [p["tok_s"] for p in pts], "o-", label=f"Tandem {FORMAT[quant]}")
            ttft.plot(cs, [p["ttft_mean_ms"] for p in pts], "o-", color=line.get_color(),
                      label=f"Tandem {FORMAT[quant]}")
            peer = SERVE_PEER.get((model, quant))
            if peer:
                name, tps, peer_ttft = peer
                tput.plot(sorted(tps), [tps[c] for c in sorted(tps)], "x--",
                          color=line.get_color(), label=f"llama.cpp {name}")
                if peer_ttft:
                    ttft.plot([8], [peer_ttft], "x", markersize=10, color=line.get_color(),
                              label=f"llama.cpp {name} (c=8)")
        for ax, ylabel in ((tput, "aggregate output tok/s"), (ttft, "mean time to first token (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent requests (128-token prompts, 128 new tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        tput.set_title(f"{model} through tandem serve (2 cores)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def label(t):
    fmt = FORMAT[t["quantization"]]
    if t["quantization"] == "int4":
        fmt += f" g{t['group']}"
    return f"{fmt}, {t['matmul_inputs']} inputs"


def decode_batch(data, out):
    models = sorted({t["model"] for t in data["throughput"]}, key=lambda m: m != "llama-1b")
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for col, model in enumerate(models):
        ax = axes[0][col]
        for t in data["throughput"]:
            if t["model"] != model:
                continue
            batches = [1] + sorted(int(b) for b in t["batch_decode_tok_s"])
            tps = [t["decode_b1_tok_s"]] + [t["batch_decode_tok_s"][str(b)] for b in batches[1:]]
            ax.plot(batches, tps, "o-", label=label(t))
        if model == "llama-1b":
            for quant, p in QUANT_PEER.items():
                lo = float(p["b1"].split("-")[0])
                ax.plot([1, 8], [lo, p["b8"]], "x--", color="gray", alpha=0.6)
                ax.annotate(f"llama.cpp {p['name']}", (8, p["b8"]), fontsize=7, color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequences decoding together (batch)")
        ax.set_ylabel("decode tok/s (all sequences)")
        ax.set_title(f"{model} decode throughput (CpuBackend, 2 cores)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def roofline(data, out):
    rows = sorted(data["throughput"], key=lambda t: (t["model"], t["quantization"], t["group"],
                                                       t["matmul_inputs"]))
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 1.5))
    names = [f"{t['model']} {label(t)}" for t in rows]
    ax.barh(range(len(rows)), [100 * t["roofline_fraction"] for t in rows],
            color=["tab:blue" if t["model"] == "llama-1b" else "tab:orange" for t in rows])
    ax.axvline(85, color="red", linestyle="--", label="goal: 85%")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("batch-1 decode, % of the memory roofline (bandwidth measured in the same run)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks"
    wrote = []
    serve = load(results, "serve_curve")
    if serve:
        serve_curve(serve, os.path.join(results, "serve_curve.png"))
        wrote.append("serve_curve.png")
    quant = load(results, "quantization")
    if quant:
        decode_batch(quant, os.path.join(results, "decode_batch.png"))
        roofline(quant, os.path.join(results, "roofline.png"))
        wrote += ["decode_batch.png", "roofline.png"]
    print(f"plots: wrote {', '.join(wrote) or 'nothing'} in {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
