"""Section "peer": Tandem beside llama.cpp's server (scripts/bench/peer.sh).

WORK holds settings.json, machine.txt, tandem.txt, commands.txt and the client's reports
<side>.<format>.c<C>.<round>.json and <side>.<format>.prefix.<round>.json (side: tandem or
peer). Figures are medians over the rounds; a ratio is the median of each round's own
Tandem / peer ratio (the two servers ran minutes apart in that round), with the rounds' range.
"""
import glob
import json
import os
import re

from benchfmt import commands_block, fmt, median, pct, spread, table, write

TANDEM_NAMES = {"bf16": "bf16", "int8": "int8 (per channel)"}


def tandem_name(f):
    m = re.match(r"int4g(\d+)$", f)
    return f"int4 g{m.group(1)}" if m else TANDEM_NAMES.get(f, f)


def load(work):
    """{(side, format, case): {round: report}}; case is a concurrency (int) or "prefix"."""
    runs = {}
    for path in glob.glob(os.path.join(work, "*.json")):
        m = re.match(r"(tandem|base|peer)\.([^.]+)\.(c\d+|prefix)\.(\d+)\.json$",
                     os.path.basename(path))
        if not m:
            continue
        case = m.group(3)
        case = int(case[1:]) if case != "prefix" else case
        runs.setdefault((m.group(1), m.group(2), case), {})[int(m.group(4))] = json.load(open(path))
    return runs


def figure(runs, key, field):
    waves = runs.get(key, {})
    return median(w.get(field) for w in waves.values())


def ratios(runs, tandem_key, peer_key, field):
    t, p = runs.get(tandem_key, {}), runs.get(peer_key, {})
    return [t[r][field] / p[r][field] for r in sorted(t)
            if r in p and t[r].get(field) and p[r].get(field)]


def cell(runs, tkey, pkey, field):
    """'Tandem / peer (ratio, range)' of one field."""
    tv, pv = figure(runs, tkey, field), figure(runs, pkey, field)
    if tv is None or pv is None:
        return "-"
    rs = ratios(runs, tkey, pkey, field)
    if len(rs) < 2:
        return f"{fmt(tv)} / {fmt(pv)} ({fmt(median(rs))}x)"
    return f"{fmt(tv)} / {fmt(pv)} ({fmt(median(rs))}x, {spread(rs)})"


def matrix_bytes(fmt_, n, k):
    """Bytes one [n, k] weight matrix takes in Tandem's format fmt_ (common/base/quant.h):
    int8 one byte a weight + one f32 scale a row; int4 gG half a byte a weight + an f32 scale and
    zero per row and group; bf16 two bytes a weight."""
    m = re.match(r"int4g(\d+)$", fmt_)
    if m:
        g = int(m.group(1))
        return n * (k + 31) // 32 * 16 + 8 * n * ((k + g - 1) // g)
    if fmt_ == "int8":
        return n * ((k + 3) // 4 * 4) + 4 * n
    return 2 * n * k


def active_bytes_per_token(model_dir, fmt_):
    """Weight bytes one decoded token reads in Tandem (as Model::decode_weight_bytes counts
    them): every layer's attention projections, its f32 router and num_experts_per_tok experts'
    three projections, the LM head, and one row of the bf16 input embedding; norms and the KV
    cache (short sequences here) are left out."""
    c = json.load(open(os.path.join(model_dir, "config.json")))
    h, heads = c["hidden_size"], c["num_attention_heads"]
    kv, hd = c.get("num_key_value_heads", heads), c.get("head_dim", h // heads)
    experts = c.get("num_local_experts", c.get("num_experts", 0))
    ef = c.get("moe_intermediate_size", c["intermediate_size"])
    layer = (matrix_bytes(fmt_, heads * hd, h) + 2 * matrix_bytes(fmt_, kv * hd, h)
             + matrix_bytes(fmt_, h, heads * hd))
    if experts:
        layer += 4 * experts * h + c["num_experts_per_tok"] * (
            2 * matrix_bytes(fmt_, ef, h) + matrix_bytes(fmt_, h, ef))
    else:
        layer += 2 * matrix_bytes(fmt_, ef, h) + matrix_bytes(fmt_, h, ef)
    return c["num_hidden_layers"] * layer + matrix_bytes(fmt_, c["vocab_size"], h) + 2 * h


def membw_gbps(path):
    m = re.search(r"median ([\d.]+) GB/s", open(path).read())
    return float(m.group(1)) if m else None


def roof_runs(work, fmt_, prefix="roof"):
    """Tandem's interleaved batch-1 runs of format fmt_ (peer.sh's roofline(); prefix roofbase:
    the base build's): per run its TPOT and the mean of the `membw` reads just before and after
    it."""
    out = []
    for path in sorted(glob.glob(os.path.join(work, f"{prefix}.{fmt_}.*.json"))):
        m = re.match(rf"{prefix}\.{re.escape(fmt_)}\.(\d+)\.(\d+)\.json$",
                     os.path.basename(path))
        if not m:
            continue
        rep, i = int(m.group(1)), int(m.group(2))
        bws = [membw_gbps(os.path.join(work, f"{prefix}.{fmt_}.{rep}.{j}.membw.txt"))
               for j in (i - 1, i)
               if os.path.exists(os.path.join(work, f"{prefix}.{fmt_}.{rep}.{j}.membw.txt"))]
        tpot = json.load(open(path)).get("tpot_ms_median")
        if tpot and bws and None not in bws:
            out.append({"round": rep, "run": i, "tpot_ms": tpot, "membw_gbps": sum(bws) / len(bws)})
    return out


def moe_section(work, settings, runs, pairs, concs, summary):
    """Decode tokens/s at each concurrency (C / TPOT: prefill left out) beside the peer's, and
    Tandem's batch-1 weight bytes per token against the memory-bandwidth roofline."""
    model_dir = read_optional(work, "model_dir.txt")
    threads = settings["threads"]
    rows_dec, rows_roof = [], []
    for tf, pf in pairs:
        label = f"{tandem_name(tf)} / {pf}"
        row = [label]
        for c in concs:
            tkey, pkey = ("tandem", tf, c), ("peer", pf, c)
            dec = {k: {r: c * 1e3 / w["tpot_ms_median"] for r, w in runs.get(k, {}).items()
                       if w.get("tpot_ms_median")} for k in (tkey, pkey)}
            tv, pv = median(dec[tkey].values()), median(dec[pkey].values())
            rs = [dec[tkey][r] / dec[pkey][r] for r in sorted(dec[tkey]) if r in dec[pkey]]
            row.append("-" if tv is None or pv is None else
                       f"{fmt(tv)} / {fmt(pv)} ({fmt(median(rs))}x"
                       + (f", {spread(rs)})" if len(rs) > 1 else ")"))
            summary["pairs"][f"{tf}:{pf}"][str(c)]["decode_tokens_per_s"] = {
                "tandem": tv, "peer": pv, "ratio_median": median(rs), "ratios": rs}
        rows_dec.append(row)
        rr = roof_runs(work, tf)
        if model_dir and rr:
            per_token = active_bytes_per_token(model_dir, tf)
            rates = [1e3 / r["tpot_ms"] for r in rr]
            bws = [r["membw_gbps"] for r in rr]
            fracs = [per_token * rate / 1e9 / bw for rate, bw in zip(rates, bws)]
            rate = median(rates)
            rows_roof.append([tandem_name(tf), f"{per_token / 1e6:.0f} MB", str(len(rr)),
                              f"{fmt(rate)} ({spread(rates)})",
                              f"{fmt(per_token * rate / 1e9)}",
                              f"{fmt(median(bws))} ({spread(bws)})",
                              f"**{pct(median(fracs))}** ({pct(min(fracs))}-{pct(max(fracs))})"])
            summary["pairs"][f"{tf}:{pf}"]["roofline"] = {
                "bytes_per_token": per_token, "runs": rr, "decode_tokens_per_s": rate,
                "membw_gbps": median(bws), "fractions": fracs, "fraction": median(fracs)}
    md = ("\n### Decode tokens/s by concurrency, prefill left out (higher is better)\n\n"
          "C / TPOT (the wave's median time per output token): the rate the C sequences "
          "decode at together once their prompts are in.\n\n")
    md += table(["Tandem / peer weights"] + [f"c={c}" for c in concs], rows_dec) + "\n"
    if rows_roof:
        md += ("\n### Batch 1 against the memory-bandwidth roofline (Tandem)\n\n"
               "Weights read per token: the active parameters in Tandem's format (attention, the "
               "f32 router, the top-k experts' three projections, the LM head and one "
               "embedding row; the KV cache is negligible at these lengths). Measured side by "
               f"side: after each Tandem server's waves, {settings.get('roof_runs', 3)} "
               "single-request decode runs per round, each between two `membw` reads (1 GiB "
               f"buffer, {threads} threads) of as many bytes as the run reads; a run's fraction "
               "= its bytes per token / TPOT / the mean bandwidth of the reads around it. Cells: "
               "median over all runs (range).\n\n")
        md += table(["Tandem weights", "weights read / token", "runs", "decode tok/s",
                     "streamed GB/s (median)", "membw GB/s", "of roofline"], rows_roof) + "\n"
    return md


def roof_fraction(work, model_dir, fmt_, prefix):
    """(median fraction of the roofline, min, max, runs) of Tandem's batch-1 runs, or None."""
    rr = roof_runs(work, fmt_, prefix)
    if not model_dir or not rr:
        return None
    per_token = active_bytes_per_token(model_dir, fmt_)
    fracs = [per_token * 1e3 / r["tpot_ms"] / 1e9 / r["membw_gbps"] for r in rr]
    return median(fracs), min(fracs), max(fracs), len(rr)


def tier_section(work, settings, runs, pairs, concs, summary):
    """The issue-42 table of one tier: batch-1 TPOT, TTFT of one prompt (c=1) and the aggregate
    tok/s at the highest concurrency, for the base build (before), Tandem (after) and the peer,
    with Tandem's batch-1 fraction of the memory roofline where measured."""
    model_dir = read_optional(work, "model_dir.txt")
    cmax = max(c for c in concs) if concs else None
    has_base = any(side == "base" for (side, _, _) in runs)
    rows = []
    for tf, pf in pairs:
        def trio(field, c):
            vals = [figure(runs, (side, f, c), field)
                    for side, f in (("base", tf), ("tandem", tf), ("peer", pf))]
            rs = ratios(runs, ("tandem", tf, c), ("peer", pf, c), field)
            b, t, p = (fmt(v) if v is not None else "-" for v in vals)
            ratio = f" ({fmt(median(rs))}x)" if rs else ""
            return f"{b} -> {t} / {p}{ratio}" if has_base else f"{t} / {p}{ratio}"
        row = [f"{tandem_name(tf)} / {pf}", trio("tpot_ms_median", 1),
               trio("ttft_ms_median", 1), trio("output_tokens_per_s", cmax)]
        roof = []
        for prefix in (("roofbase", "roof") if has_base else ("roof",)):
            r = roof_fraction(work, model_dir, tf, prefix)
            roof.append(f"{pct(r[0])} ({pct(r[1])}-{pct(r[2])}, {r[3]} runs)" if r else "-")
            if r:
                summary["pairs"][f"{tf}:{pf}"][f"{prefix}_fraction"] = r[0]
        row.append(" -> ".join(roof))
        rows.append(row)
    who = "before -> after / peer" if has_base else "Tandem / peer"
    md = (f"\n### Per tier: Tandem (TANDEM_SIMD={settings.get('tandem_simd', 'default')}) against "
          "llama.cpp built for the same tier\n\n"
          f"Cells: {who} (median over rounds; the ratio is the median of each round's Tandem / "
          "peer). Roofline: Tandem's batch-1 weight bytes per token / TPOT / the memory read "
          "bandwidth measured right before and after each run (`membw`, same threads).\n\n")
    md += table(["weights", "batch-1 TPOT ms", "TTFT ms, one prompt",
                 f"aggregate tok/s, c={cmax}", "batch 1, of roofline"], rows) + "\n"
    return md


def read_optional(work, name):
    path = os.path.join(work, name)
    return open(path).read().strip() if os.path.exists(path) else ""


def render_peer(work, outdir, section="peer"):
    settings = json.load(open(os.path.join(work, "settings.json")))
    machine = open(os.path.join(work, "machine.txt")).read().strip()
    tandem = open(os.path.join(work, "tandem.txt")).read().strip()
    runs = load(work)
    pairs = [p.split(":") for p in settings["pairs"].split()]
    concs = sorted({c for (_, _, c) in runs if c != "prefix"})
    short = sum(w.get("short_outputs", 0) for waves in runs.values() for w in waves.values())
    with open("/proc/loadavg") as f:
        load_end = " ".join(f.read().split()[:3])

    moe = section == "peer_moe"
    script = "scripts/bench/peer_moe.sh" if moe else "scripts/bench/peer.sh"
    title = ("Mixture of experts: Tandem beside llama.cpp's server" if moe
             else "Tandem beside llama.cpp's server")
    md = (f"## {title}\n\n"
          f"Produced by `{script}` ({settings['reps']} round(s); in each round, per "
          "pair, one Tandem server then one llama-server, never both at once). Machine: "
          f"{machine}; load average {load_end} at the end.")
    note = read_optional(work, "note.txt")
    if note:
        md += f" Note: {note}"
    md += (f"\n\nPeer: llama.cpp `{settings['peer_commit']}` (`llama-server`, CPU build). "
           f"Model: Tandem's random {settings['preset']} (bf16), given to llama.cpp bit for bit "
           "as a BF16 GGUF (`scripts/bench/peer_gguf.py`, through llama.cpp's gguf-py) and "
           "quantized by `llama-quantize`; Tandem quantizes the same bf16 weights at load. "
           f"Both with {settings['threads']} compute threads, one slot / sequence per concurrent "
           "request. One client (`scripts/bench/peer_client.py`) for both: streamed "
           f"`/v1/completions`, prompts of {settings['prompt_len']} token ids, "
           f"{settings['output_len']} new tokens (ignore_eos), greedy; for each concurrency C "
           "one wave of C requests started together, the same prompts on both servers (a seed "
           "per round and C), after a warm-up request. TPOT = (last token - first token) / "
           "(tokens - 1) per request, median of the wave; TTFT = median time to first token; "
           "tok/s = output tokens of the wave / its wall time (prefill included). Cells: "
           "Tandem / peer (median over rounds of each round's Tandem / peer ratio, its range).")
    # Busy: other work on the cores. At the start, any load past the cores; at the end, past the
    # cores plus the compute threads the benchmark's own last server kept running.
    cores = os.cpu_count() or 1
    load_start = [float(x) for x in re.findall(r"load average ([\d.]+)", machine)]
    busy = [x for x in load_start if x > cores]
    if float(load_end.split()[0]) > cores + int(settings["threads"]):
        busy.append(float(load_end.split()[0]))
    if busy:
        md += (f" **The machine was busy** (load average {fmt(max(busy))} on {cores} cores at "
               "the start or end): llama.cpp's threads meet at a barrier after every graph "
               "operation, so a descheduled thread stalls each step and its figures fall much "
               "further than Tandem's under load; compare on an idle machine.")
    if short:
        md += f" {short} request(s) returned fewer tokens than asked."
    check = read_optional(work, "check.txt")
    if check:
        md += f" Same-weights check (bf16 GGUF on llama-server vs Tandem bf16): {check}."
    md += "\n"

    summary = {"settings": settings, "pairs": {}}
    rows_tpot, rows_tps, rows_ttft, rows_prefix = [], [], [], []
    for tf, pf in pairs:
        label = f"{tandem_name(tf)} / {pf}"
        tk = lambda c: ("tandem", tf, c)  # noqa: E731
        pk = lambda c: ("peer", pf, c)  # noqa: E731
        rows_tpot.append([label, cell(runs, tk(1), pk(1), "tpot_ms_median"),
                          cell(runs, tk(1), pk(1), "ttft_ms_median")])
        rows_tps.append([label] + [cell(runs, tk(c), pk(c), "output_tokens_per_s")
                                   for c in concs])
        rows_ttft.append([label] + [cell(runs, tk(c), pk(c), "ttft_ms_median") for c in concs])
        if runs.get(tk("prefix")) or runs.get(pk("prefix")):
            rows_prefix.append([label, cell(runs, tk("prefix"), pk("prefix"), "ttft_ms_median"),
                                cell(runs, tk("prefix"), pk("prefix"), "output_tokens_per_s")])
        summary["pairs"][f"{tf}:{pf}"] = {
            str(c): {side: {k: figure(runs, (side, f, c), k)
                            for k in ("tpot_ms_median", "ttft_ms_median", "output_tokens_per_s")}
                     for side, f in (("tandem", tf), ("peer", pf))}
            for c in concs + ["prefix"]}

    if not moe:
        md += tier_section(work, settings, runs, pairs, concs, summary)
    md += "\n### Batch 1: time per output token (lower is better)\n\n"
    md += table(["Tandem / peer weights", "TPOT ms, c=1", "TTFT ms, c=1"], rows_tpot) + "\n"
    md += "\n### Aggregate output tokens/s by concurrency (higher is better)\n\n"
    md += table(["Tandem / peer weights"] + [f"c={c}" for c in concs], rows_tps) + "\n"
    if moe:
        md += moe_section(work, settings, runs, pairs, concs, summary)
    md += "\n### Time to first token (ms) by concurrency (lower is better)\n\n"
    md += table(["Tandem / peer weights"] + [f"c={c}" for c in concs], rows_ttft) + "\n"
    if rows_prefix:
        md += (f"\n### Shared prefix: {settings['prefix_conc']} requests, one "
               f"{settings['prefix_len']}-token prefix + {settings['prompt_len']} tokens each\n\n"
               "One request with the prefix runs first (alone, 1 new token), then the wave. "
               "Tandem shares cached prefix blocks between requests; llama-server reuses a "
               "prompt prefix only within the slot that processed it.\n\n")
        md += table(["Tandem / peer weights", "TTFT ms (median)", "tok/s"], rows_prefix) + "\n"
    command = read_optional(work, "command.txt")
    if command:
        md += f"\nReproduce: `{command}`\n"
    md += "\n" + commands_block(work, tandem).replace(settings["peer_src"], "$LLAMA_CPP_DIR")
    md += "\n"
    write(outdir, section, md, summary)

