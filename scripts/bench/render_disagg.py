"""Section: disaggregated prefill/decode (scripts/bench/disagg.sh)."""
import glob
import os
import re

from benchfmt import commands_block, fmt, header, load_reports, median, pct, spread, table, write

KVT_ROW = re.compile(r"^(\S+)\s+(tcp|loopback)\s+(\S+)\s+(\d+) KiB\s+(\d+)\s+([\d.]+) MiB\s+"
                     r"([\d.]+) GB/s\s+([\d.]+) ms\s+([\d.]+)")


def _kvtransfer(work):
    runs = {}
    for path in sorted(glob.glob(os.path.join(work, "kvtransfer.*.txt"))):
        for line in open(path):
            m = KVT_ROW.match(line.strip())
            if m:
                key = (m.group(1), m.group(2), m.group(3))
                runs.setdefault(key, {"region_kib": int(m.group(4)), "blocks": int(m.group(5)),
                                      "mib": float(m.group(6)), "gbps": [], "ms": [],
                                      "cpu_s_per_gb": []})
                runs[key]["gbps"].append(float(m.group(7)))
                runs[key]["ms"].append(float(m.group(8)))
                runs[key]["cpu_s_per_gb"].append(float(m.group(9)))
    return runs


def _split(report):
    s = report["server_ttft_split_ms"]
    return {k: s[k]["mean"] for k in ("queue", "prefill", "kv_transfer", "first_decode",
                                      "server_ttft")} | {
        "client_ttft": report["ttft_ms"]["mean"], "remote": s["remote"],
        "requests": s["requests"],
        "transfer_share": (s["kv_transfer"]["mean"] / s["server_ttft"]["mean"]
                           if s["server_ttft"]["mean"] else None)}


def _itl(decode, long):
    return {"itl_p50": decode["itl_ms"]["p50"], "itl_p90": decode["itl_ms"]["p90"],
            "itl_p99": decode["itl_ms"]["p99"], "itl_max": decode["itl_ms"]["max"],
            "tpot_mean": decode["tpot_ms"]["mean"],
            "decode_tokens_per_s": decode["throughput"]["output_tokens_per_s"],
            "long_prompts": long["requests"]["completed"],
            "long_ttft_p50": long["ttft_ms"]["p50"]}


def render_disagg(work, outdir):
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    summary = {}
    md_parts = []

    kvt = _kvtransfer(work)
    rows = []
    for (model, transport, checksum), r in sorted(kvt.items()):
        rows.append([model, transport, checksum, f"{r['blocks']} blocks x {r['region_kib']} KiB "
                     f"x layers = {r['mib']:.1f} MiB", fmt(median(r["gbps"])), spread(r["gbps"]),
                     fmt(median(r["ms"])), fmt(median(r["cpu_s_per_gb"]))])
    summary["kvtransfer"] = {"/".join(k): v for k, v in kvt.items()}
    md_parts.append("### KV transfer throughput (TCP, loopback)\n\nA whole 2048-token prompt's KV "
                    "pushed layer by layer between two endpoints in one process "
                    "(`kvtransfer_bench`).\n\n" + table(
                        ["KV layout", "transport", "checksum", "per transfer", "GB/s (median)",
                         "runs", "latency ms", "CPU s/GB"], rows))

    lw = [_split(r) for r in load_reports(work, "ttft-layerwise.*.json")]
    wh = [_split(r) for r in load_reports(work, "ttft-whole.*.json")]
    reps = min(len(lw), len(wh))
    rows = []
    for key, name in [("queue", "queue (decode worker: arrival to reservation)"),
                      ("prefill", "prefill (prefill worker: arrival to last layer)"),
                      ("kv_transfer", "KV transfer (decode worker: wait for the KV beyond the prefill)"),
                      ("first_decode", "first decode (rest of server TTFT)"),
                      ("server_ttft", "server TTFT"), ("client_ttft", "client TTFT")]:
        rows.append([name, fmt(median([x[key] for x in lw])), fmt(median([x[key] for x in wh]))])
    lw_share = median([x["transfer_share"] for x in lw])
    wh_share = median([x["transfer_share"] for x in wh])
    rows.append(["**transfer share of server TTFT**", pct(lw_share), pct(wh_share)])
    remote = sum(x["remote"] for x in lw + wh)
    total = sum(x["requests"] for x in lw + wh)
    goal = ("met" if lw_share is not None and lw_share <= 0.2 else "**not met**")
    summary["ttft_split"] = {"layerwise": lw, "whole_prompt": wh,
                             "layerwise_transfer_share": lw_share,
                             "whole_prompt_transfer_share": wh_share}
    note = "" if remote == total and total > 0 else (
        f"\n\n**Only {remote} of {total} finals reported a remote prefill**: the split is "
        "incomplete (the decode worker must fill Timings.remote_prefill_s / kv_transfer_s).")
    md_parts.append(
        "### TTFT split of 2k-token prompts: layer-wise push vs whole-prompt push\n\n"
        "Prefill worker + decode worker + router (`--max-model-len 4096`), one request at a "
        "time, 2048-token prompts, 4 output tokens; means in ms (median over repetitions) from "
        "the finals' server timings. Goal: the transfer adds at most 20% to TTFT with "
        f"layer-wise push: {goal}.\n\n" + table(
            ["TTFT part (ms)", "layer-wise push", "whole-prompt push (--no-layerwise-push)"],
            rows) + note)

    names = sorted({os.path.basename(p).split("-decode.")[0][4:]
                    for p in glob.glob(os.path.join(work, "itl-*-decode.*.json"))},
                   key=lambda n: (n == "disaggregated", n))
    itl = {n: [_itl(d, l) for d, l in zip(load_reports(work, f"itl-{n}-decode.*.json"),
                                          load_reports(work, f"itl-{n}-long.*.json"))]
           for n in names}
    rows = []
    for key, name in [("itl_p50", "inter-token p50 (ms)"), ("itl_p90", "inter-token p90 (ms)"),
                      ("itl_p99", "**inter-token p99 (ms)**"), ("itl_max", "inter-token max (ms)"),
                      ("tpot_mean", "TPOT mean (ms)"),
                      ("decode_tokens_per_s", "decode load output tokens/s"),
                      ("long_prompts", "long prompts served"),
                      ("long_ttft_p50", "long prompt TTFT p50 (ms)")]:
        rows.append([name] + [f"{fmt(median([x[key] for x in itl[n]]))} "
                              f"({spread([x[key] for x in itl[n]])})" for n in names])
    ratio_lines = []
    summary["interference"] = dict(itl)
    for n in names:
        if n == "disaggregated" or "disaggregated" not in itl:
            continue
        ratios = [m["itl_p99"] / d["itl_p99"] for m, d in zip(itl[n], itl["disaggregated"])
                  if d["itl_p99"]]
        summary["interference"][f"p99_ratio_{n}_over_disaggregated"] = ratios
        ratio_lines.append(f"**p99 inter-token latency, {n} / disaggregated = "
                           f"{fmt(median(ratios))}x** (per repetition: {spread(ratios)})")
    md_parts.append(
        "### Inter-token latency while long prompts arrive: monolithic vs disaggregated\n\n"
        "A steady decode load (4 clients in a closed loop, 32-token prompts, 64 output tokens) "
        "and, at the same time, 1024-token prompts arriving as a Poisson process (one output "
        "token each), both for the same duration. monolithic-tN: one `tandem serve` with N "
        "compute threads (chunked prefill mixes 512-token prompt chunks into the decode "
        "steps). disaggregated: prefill worker pinned to core 0, decode worker to core 1, one "
        "compute thread each, plus the router. Median over repetitions (spread in brackets)."
        "\n\n" + "; ".join(ratio_lines) + ".\n\n" + table(["decode load", *names], rows))

    md = header(work, "scripts/bench/disagg.sh",
                "## Disaggregated prefill and decode", reps)
    md += "\n" + "\n\n".join(md_parts) + "\n\n" + commands_block(work, tandem) + "\n"
    write(outdir, "disagg", md, summary)
