#!/usr/bin/python3
"""Speculative decoding on vs off, side by side (driven by scripts/bench/speculative.sh).

Two servers identical but for --speculative-method (none / ngram). For each batch size B and
repetition, B concurrent greedy streams of copy-heavy prompts with ignore_eos and a fixed output
length go to one server, then the same requests to the other (the order alternates per
repetition). A copy-heavy prompt is one whose answer repeats spans of the prompt. Random weights
copy nothing on purpose, so each prompt is built from the model itself: a random sentence
followed by the model's own greedy continuation of it (--lead-tokens, not timed). The timed
answer then continues that same greedy text, and the random model's greedy text repeats its own
spans (it falls into loops), which the prompt already holds: the situation of a real model
quoting or editing its input. The driver reports the share of output tokens that speculation
accepted, so the workload's copy-heaviness is visible next to the speedup. Throughput = output tokens / wall time of the batch (first request sent to last
stream ended). The acceptance rate comes from the ngram server's /metrics
(tandem_spec_accepted_tokens_total / tandem_spec_draft_tokens_total, deltas over each batch
size's timed runs, not the untimed leads). Every output of the ngram server must equal the
plain server's.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "e2e"))
import grpc  # noqa: E402

from tandem_testlib import generate, load_stubs, make_prompt  # noqa: E402


def scrape(address):
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    totals = {}
    for name in ("tandem_spec_draft_tokens_total", "tandem_spec_accepted_tokens_total"):
        totals[name] = sum(float(m.group(1)) for m in
                           re.finditer(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
    return totals


def run_batch(stubs, stub, prompts, max_tokens):
    """prompts: text, or lists of token ids."""
    def one(prompt):
        kwargs = ({"text": prompt} if isinstance(prompt, str) else
                  {"token_ids": stubs.common.TokenIds(ids=prompt)})
        out = generate(stubs, stub, timeout=600, **kwargs,
                       sampling=dict(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
        return out["ids"]

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(one, prompts))
    wall = time.monotonic() - start
    return outputs, sum(len(o) for o in outputs) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", required=True)
    ap.add_argument("--on", required=True)
    ap.add_argument("--on-metrics", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lead-tokens", type=int, default=64,
                    help="greedy continuation appended to each prompt's sentence")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stubs = load_stubs()
    stub = {name: stubs.gen_grpc.GenerationStub(grpc.insecure_channel(addr))
            for name, addr in (("off", args.off), ("on", args.on))}
    rng = random.Random(11)
    # Warm both servers up (weights paged in, code paths touched).
    for name in stub:
        run_batch(stubs, stub[name], ["Once upon a time"], 8)

    results = []
    identical = True
    for b in [int(x) for x in args.batches.split(",")]:
        ratios, tps = [], {"off": [], "on": []}
        drafted = accepted = 0.0
        for rep in range(args.reps):
            sentences = [make_prompt(rng, 8, 20) for _ in range(b)]
            # On both servers, so both hold the same prefix cache (a finished sequence leaves
            # its blocks cached: the timed prompt is then mostly a cache hit on either).
            leads, _ = run_batch(stubs, stub["off"], sentences, args.lead_tokens)
            identical = identical and run_batch(stubs, stub["on"], sentences,
                                                args.lead_tokens)[0] == leads
            tokenize = stub["off"].Tokenize
            prompts = [list(tokenize(stubs.gen.TokenizeRequest(text=s), timeout=60).token_ids) +
                       lead for s, lead in zip(sentences, leads)]
            order = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
            outs, rate = {}, {}
            for name in order:
                before = scrape(args.on_metrics)  # around the timed runs only (not the leads)
                outs[name], rate[name] = run_batch(stubs, stub[name], prompts, args.max_tokens)
                if name == "on":
                    after = scrape(args.on_metrics)
                    drafted += (after["tandem_spec_draft_tokens_total"] -
                                before["tandem_spec_draft_tokens_total"])
                    accepted += (after["tandem_spec_accepted_tokens_total"] -
                                 before["tandem_spec_accepted_tokens_total"])
                print(f"[speculative] batch {b} rep {rep + 1}: {name} {rate[name]:.1f} tok/s",
                      file=sys.stderr, flush=True)
            identical = identical and outs["on"] == outs["off"]
            ratios.append(rate["on"] / rate["off"])
            for name in rate:
                tps[name].append(rate[name])
        results.append({
            "batch": b,
            "off_tok_s": tps["off"], "on_tok_s": tps["on"], "ratios": ratios,
            "ratio_median": statistics.median(ratios),
            "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0,
            # Share of the output tokens that came from accepted drafts.
            "accepted_share": accepted / (b * args.reps * args.max_tokens),
            # Tokens per verification step: 1 (the target's own) + accepted per sequence-step.
        })

    summary = {"machine": open(os.path.join(args.work, "machine.txt")).read().strip(),
               "max_tokens": args.max_tokens, "lead_tokens": args.lead_tokens,
               "reps": args.reps,
               "outputs_identical": identical, "results": results}
    with open(os.path.join(args.out, "speculative.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "speculative.md"), "w") as f:
        f.write(render(summary))
    if not identical:
        sys.exit("speculative: outputs differ between speculation on and off")


def render(s):
    med = statistics.median
    rows = []
    stop = None
    for r in s["results"]:
        rows.append(f"| {r['batch']} | {med(r['off_tok_s']):.1f} | {med(r['on_tok_s']):.1f} | "
                    f"**{r['ratio_median']:.2f}x** | {min(r['ratios']):.2f}-{max(r['ratios']):.2f}"
                    f" | {r['acceptance']:.0%} ({int(r['accepted'])}/{int(r['drafted'])}) | "
                    f"{r['accepted_share']:.0%} |")
        if stop is None and r["ratio_median"] < 1.0:
            stop = r["batch"]
    b1 = next(r for r in s["results"] if r["batch"] == 1)
    goal = "met" if b1["ratio_median"] >= 1.8 else "**not met**"
    where = (f"Speculation stops paying at batch {stop}: there the verification of the drafts "
             "costs more target compute than the accepted tokens save." if stop is not None else
             "Speculation still paid at the largest batch measured.")
    return f"""<!-- BEGIN speculative -->
## Speculative decoding: n-gram proposer on vs off

Produced by `scripts/bench/speculative.sh` ({s['reps']} repetitions per batch size, the two
servers alternating). Machine: {s['machine']}.

Two `tandem serve` processes on the random llama-110m bf16 model (one compute thread each),
identical but for `--speculative-method ngram --num-speculative-tokens 4` (adaptive k on).
Workload: B concurrent greedy streams of {s['max_tokens']} output tokens with `ignore_eos`, each on
a copy-heavy prompt, one whose answer repeats spans of the prompt. Random weights copy nothing
on purpose, so the prompt is built from the model: a random sentence followed by the model's own
greedy continuation of it ({s['lead_tokens']} tokens, generated on both servers before timing); the
timed answer continues that greedy text, which repeats its own spans (random weights fall into
loops) that the prompt already holds, as a real model does when it quotes or edits its input.
Tokens/s = output tokens of the batch over its wall time. Acceptance = accepted / drafted tokens
from the ngram server's `/metrics`; accepted share = accepted tokens / output tokens (how much of
the answer speculation supplied).
Outputs with speculation on were {'identical' if s['outputs_identical'] else '**not identical**'}
to the outputs without it, token for token, in every run.

**Batch 1: {b1['ratio_median']:.2f}x** tokens/s with speculation (goal >= 1.8x: {goal}).

| batch | off tok/s (median) | ngram tok/s (median) | on / off (median of per-run ratios) | runs | acceptance | accepted share |
| --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

{where}

```sh
BUILD_DIR=build scripts/bench/run_all.sh speculative
```
<!-- END speculative -->
"""


if __name__ == "__main__":
    main()
