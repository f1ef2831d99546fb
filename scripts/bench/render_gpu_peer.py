"""Section: Tandem beside llama.cpp's server on the same GPU (scripts/bench/gpu_peer.sh)."""
import glob
import json
import os
import re

from benchfmt import commands_block, fmt, median, table, write


def _load(work):
    """{(side, concurrency): {round: report}} from <side>.c<C>.<round>.json."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(work, "*.c*.json"))):
        m = re.match(r"(tandem|peer)\.c(\d+)\.(\d+)\.json$", os.path.basename(path))
        if m:
            runs.setdefault((m.group(1), int(m.group(2))), {})[int(m.group(3))] = json.load(
                open(path))
    return runs


def _figure(runs, side, c, field):
    return median(r[field] for r in runs.get((side, c), {}).values())


def _ratio(runs, c, field, invert=False):
    """Median over rounds of Tandem / peer (peer / Tandem for times: `invert`)."""
    t, p = runs.get(("tandem", c), {}), runs.get(("peer", c), {})
    values = []
    for rep in sorted(set(t) & set(p)):
        a, b = t[rep][field], p[rep][field]
        if a and b:
            values.append(b / a if invert else a / b)
    return median(values)


def _check(work):
    try:
        texts = [json.load(open(os.path.join(work, f"check.{side}.json")))["texts"]
                 for side in ("tandem", "peer")]
    except (OSError, KeyError, ValueError):
        return None
    if texts[0] == texts[1]:
        return "both greedy-decode the same 8 tokens from each of 3 prompts"
    return f"**the greedy texts differ** (Tandem {texts[0]}, llama.cpp {texts[1]})"


def _times(value):
    """A ratio as "1.23x", or fmt's placeholder when there is none."""
    return fmt(value) + "x" if value is not None else fmt(value)


def render_gpu_peer(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    gpu = open(os.path.join(work, "gpu.txt")).read().strip()
    settings = json.load(open(os.path.join(work, "settings.json")))
    command = open(os.path.join(work, "command.txt")).read().strip()
    note = open(os.path.join(work, "note.txt")).read().strip()
    runs = _load(work)
    concs = sorted({c for (_, c) in runs})
    md = ("## Tandem and llama.cpp's server on the same GPU\n\n"
          f"Produced by `{command}` ({settings['reps']} rounds, the servers alternating). GPU: "
          f"{gpu}. Random {settings['preset']}: Tandem serves its bf16 weights "
          "(`tandem serve --device cuda`, bf16 activations, CUDA graphs), llama.cpp "
          f"({settings['peer_commit']}, CUDA build, every layer on the GPU, flash attention) "
          "the same values as an f16 GGUF. One client (scripts/bench/peer_client.py, OpenAI "
          "/v1/completions, streamed) sends one wave of C requests per concurrency: "
          f"{settings['prompt_len']}-token prompts as token ids, {settings['output_len']} new "
          "tokens, ignore_eos, greedy. Aggregate tok/s = output tokens / wall time of the wave; "
          "TPOT = time per output token after the first (median over the wave's requests); "
          "ratios are medians over rounds of Tandem / llama.cpp (for TPOT: llama.cpp / Tandem), "
          "so above 1 means Tandem is faster.\n")
    if settings.get("dry_run"):
        md += ("\n**Dry run: Tandem's side only (no llama.cpp build), on "
               f"`--device {settings.get('device', 'cuda')}`.**\n")
    if note:
        md += f"\n{note}\n"
    check = _check(work)
    if check:
        md += f"\nSame-weights check: {check}.\n"
    md += "\n"
    rows, summary = [], {}
    for c in concs:
        point = {
            "tandem_tok_s": _figure(runs, "tandem", c, "output_tokens_per_s"),
            "peer_tok_s": _figure(runs, "peer", c, "output_tokens_per_s"),
            "tok_s_ratio": _ratio(runs, c, "output_tokens_per_s"),
            "tandem_tpot_ms": _figure(runs, "tandem", c, "tpot_ms_median"),
            "peer_tpot_ms": _figure(runs, "peer", c, "tpot_ms_median"),
            "tpot_ratio": _ratio(runs, c, "tpot_ms_median", invert=True),
            "tandem_ttft_ms": _figure(runs, "tandem", c, "ttft_ms_median"),
            "peer_ttft_ms": _figure(runs, "peer", c, "ttft_ms_median"),
            "short_or_failed": sum(r.get("short_outputs", 0) + len(r.get("errors", []))
                                   for side in ("tandem", "peer")
                                   for r in runs.get((side, c), {}).values()),
        }
        summary[f"c{c}"] = point
        rows.append([c, fmt(point["tandem_tok_s"]), fmt(point["peer_tok_s"]),
                     _times(point["tok_s_ratio"]), fmt(point["tandem_tpot_ms"]),
                     fmt(point["peer_tpot_ms"]), _times(point["tpot_ratio"]),
                     fmt(point["tandem_ttft_ms"]), fmt(point["peer_ttft_ms"]),
                     point["short_or_failed"]])
    md += table(["C", "Tandem tok/s", "llama.cpp tok/s", "ratio", "Tandem TPOT (ms)",
                 "llama.cpp TPOT (ms)", "TPOT ratio", "Tandem TTFT (ms)", "llama.cpp TTFT (ms)",
                 "short or failed"], rows)
    md += "\n\n" + commands_block(work, tandem) + "\n"
    write(outdir, "gpu_peer", md, summary)
