"""Section "peer_kernels" (scripts/bench/peer_kernels.sh): Tandem's CPU backend before / after
against llama.cpp's batched bench, per tier. WORK holds machine.txt,
<new|old|base>.<fmt>.<round>.json (quant_bench; old: the input dtype the tier's default used to
take, base: PEER_BASE_BUILD's binary with today's default) and peer.<type>.<round>.txt
(llama-batched-bench's table).
    render_peer_kernels.py WORK OUTDIR OUTPUT_LEN COMMAND
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchfmt import fmt, median, table, write  # noqa: E402

NAMES = {"int8": "int8", "int4g32": "int4 g32", "int4g128": "int4 g128", "bf16": "bf16"}


def tandem(work, tag, f, out_len):
    """Per round: (tpot ms, ttft ms, aggregate tok/s at 16, roofline fraction)."""
    out = {}
    for path in glob.glob(os.path.join(work, f"{tag}.{f}.*.json")):
        rep = int(path.rsplit(".", 2)[1])
        j = json.load(open(path))
        m = j["median"]
        dec = m.get("decode_b1_median_step_tok_s") or m["decode_b1_tok_s"]
        ttft = 1e3 * j["prefill_tokens"] / m["prefill_tok_s"]
        b16 = m["batch_decode_tok_s"]["16"]
        wave = 16 * ttft / 1e3 + out_len * 16 / b16
        out[rep] = {"tpot": 1e3 / dec, "ttft": ttft, "agg": 16 * out_len / wave,
                    "roof": m.get("roofline_fraction"), "input": j["matmul_input_dtype"],
                    "simd": j.get("simd"), "membw": m.get("membw_GBps")}
    return out


def peer(work, t, out_len):
    out = {}
    for path in glob.glob(os.path.join(work, f"peer.{t}.*.txt")):
        rep = int(path.rsplit(".", 2)[1])
        rows = {}
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 10 and cells[0] == "128" and cells[1] == str(out_len):
                rows[int(cells[2])] = [float(c) for c in cells[4:]]
        if 1 in rows and 16 in rows:
            t_pp1, _, t_tg1, _, _, _ = rows[1]
            _, _, _, _, t16, _ = rows[16]
            out[rep] = {"tpot": 1e3 * t_tg1 / out_len, "ttft": 1e3 * t_pp1,
                        "agg": 16 * out_len / t16}
    return out


def main():
    work, outdir, out_len, command = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    machine = open(os.path.join(work, "machine.txt")).read().strip()
    pairs = sorted({(os.path.basename(p).split(".")[1]) for p in
                    glob.glob(os.path.join(work, "new.*.json"))})
    types = {"int8": "q8_0", "int4g32": "q4_0", "int4g128": "q4_0", "bf16": "f16"}
    rows, summary = [], {"machine": machine, "command": command, "pairs": {}}
    simd = None
    for f in pairs:
        new, old = tandem(work, "new", f, out_len), tandem(work, "old", f, out_len)
        base = tandem(work, "base", f, out_len)
        p = peer(work, types[f], out_len)
        simd = simd or next((r["simd"] for r in new.values()), None)

        def cellv(key, higher_better):
            n = median([r[key] for r in new.values()])
            o = median([r[key] for r in old.values()]) if old else None
            b = median([r[key] for r in base.values()]) if base else None
            q = median([r[key] for r in p.values()]) if p else None
            rs = [new[r][key] / p[r][key] for r in new if r in p]
            ratio = median(rs) if rs else None
            bs = [new[r][key] / base[r][key] for r in new if r in base]
            bratio = median(bs) if bs else None
            summary["pairs"].setdefault(f, {})[key] = {
                "old": o, "base": b, "new": n, "peer": q, "ratio_new_peer": ratio,
                "ratios": rs, "ratio_new_base": bratio, "ratios_base": bs}
            if not higher_better:  # speed-ups: the other side's time / Tandem's
                ratio = 1 / ratio if ratio else None
                bratio = 1 / bratio if bratio else None
            sides = ([fmt(o)] if o is not None else []) + ([fmt(b)] if b is not None else [])
            cell = " -> ".join(sides + [f"**{fmt(n)}**"])
            if bratio is not None:
                cell += f" ({fmt(bratio)}x)"
            if q is not None:
                cell += f" / {fmt(q)} ({fmt(ratio)}x)"
            return cell

        def roof(side):
            v = [r["roof"] for r in side.values() if r["roof"]]
            return median(v) if v else None

        roofs = [roof(s) for s in (old, base) if s] + [roof(new)]
        summary["pairs"].setdefault(f, {})["roofline"] = {
            "old": roof(old) if old else None, "base": roof(base) if base else None,
            "new": roof(new)}
        inputs = " -> ".join([next(iter(s.values()))["input"] for s in (old, base) if s] +
                             [next(iter(new.values()))["input"]])
        rows.append([f"{NAMES.get(f, f)} / {types[f]}", inputs, cellv("tpot", False),
                     cellv("ttft", False), cellv("agg", True),
                     " -> ".join(f"{100 * r:.0f}%" if r else "-" for r in roofs)])
    md = (f"## Engine against engine per tier: {simd}\n\n"
          f"Produced by `scripts/bench/peer_kernels.sh`. Machine: {machine}.\n\n"
          "Cells: Tandem [old ->] [base ->] **new** [(speed-up of new over base)] / llama.cpp "
          "(speed-up of Tandem new over llama.cpp); each figure the median of the rounds, each "
          "speed-up the median of the rounds' ratios. Old = the MatMul inputs the tier's default "
          "used to take (same binary); base = the build before a change (`PEER_BASE_BUILD`) with "
          "today's default inputs (`auto`); new = this build with them. Batch-1 TPOT and the TTFT of one 128-token prompt are single requests; "
          f"the aggregate at C=16 is 16 x {out_len} output tokens over the 16 prompts' prefill "
          f"plus {out_len} decode steps at batch 16. Roofline: Tandem's batch-1 weight bytes per token / "
          "step time / read bandwidth measured before each step.\n\n")
    md += table(["weights", "Tandem inputs", "batch-1 TPOT ms", "TTFT ms, 128-token prompt",
                 "aggregate tok/s, C=16", "batch 1, of roofline"], rows) + "\n"
    md += f"\nReproduce: `{command}`\n"
    write(outdir, "peer_kernels", md, summary)


if __name__ == "__main__":
    main()
