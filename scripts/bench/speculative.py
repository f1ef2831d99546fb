#!/usr/bin/python3
"""Speculative decoding on vs off, side by side (driven by scripts/bench/speculative.sh).

Two servers identical but for --speculative-method (none / ngram). For each batch size B and
repetition, B concurrent greedy streams of copy-heavy prompts (a random sentence repeated three
times; the random model's answers also repeat their own spans) with ignore_eos and a fixed
output length go to one server, then the same requests to the other (the order alternates per
repetition). Throughput = output tokens / wall time of the batch (first request sent to last
stream ended). The acceptance rate comes from the ngram server's /metrics
(tandem_spec_accepted_tokens_total / tandem_spec_draft_tokens_total, deltas over each batch
size's runs). Every output of the ngram server must equal the plain server's.
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
    def one(prompt):
        out = generate(stubs, stub, text=prompt, timeout=600,
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
        before = scrape(args.on_metrics)
        for rep in range(args.reps):
            prompts = []
            for _ in range(b):
                sentence = make_prompt(rng, 8, 20)
                prompts.append(f"{sentence}. {sentence}. {sentence}.")
            order = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
            outs, rate = {}, {}
            for name in order:
                outs[name], rate[name] = run_batch(stubs, stub[name], prompts, args.max_tokens)
                print(f"[speculative] batch {b} rep {rep + 1}: {name} {rate[name]:.1f} tok/s",
                      file=sys.stderr, flush=True)
            identical = identical and outs["on"] == outs["off"]
            ratios.append(rate["on"] / rate["off"])
            for name in rate:
                tps[name].append(rate[name])
        after = scrape(args.on_metrics)
        drafted = after["tandem_spec_draft_tokens_total"] - before["tandem_spec_draft_tokens_total"]
        accepted = (after["tandem_spec_accepted_tokens_total"] -
                    before["tandem_spec_accepted_tokens_total"])
        results.append({
            "batch": b,
            "off_tok_s": tps["off"], "on_tok_s": tps["on"], "ratios": ratios,
            "ratio_median": statistics.median(ratios),
            "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0,
            # Tokens per verification step: 1 (the target's own) + accepted per sequence-step.
        })

    summary = {"machine": open(os.path.join(args.work, "machine.txt")).read().strip(),
               "max_tokens": args.max_tokens, "reps": args.reps,
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
                    f" | {r['acceptance']:.0%} ({int(r['accepted'])}/{int(r['drafted'])}) |")
        if stop is None and r["ratio_median"] < 1.0:
            stop = r["batch"]
    b1 = next(r for r in s["results"] if r["batch"] == 1)
    goal = "met" if b1["ratio_median"] >= 1.8 else "**not met**"
    where = (f"Speculation stops paying at batch {stop}: there the verification of the drafts "
             "costs more target compute than the accepted tokens save." if stop is not None else
             "Speculation still paid at the largest batch measured.")
    return f"""<!-- BEGIN speculative -->
## Speculative decoding: n-gram proposer on vs off (issue #5)

Produced by `scripts/bench/speculative.sh` ({s['reps']} repetitions per batch size, the two
servers alternating). Machine: {s['machine']}.

Two `tandem serve` processes on the random llama-110m bf16 model (one compute thread each),
identical but for `--speculative-method ngram --num-speculative-tokens 4` (adaptive k on).
Workload: B concurrent greedy streams, each a copy-heavy prompt (a random sentence written three
times), {s['max_tokens']} output tokens with `ignore_eos`. Tokens/s = output tokens of the batch
over its wall time. Acceptance = accepted / drafted tokens from the ngram server's `/metrics`.
Outputs with speculation on were {'identical' if s['outputs_identical'] else '**not identical**'}
to the outputs without it, token for token, in every run.

**Batch 1: {b1['ratio_median']:.2f}x** tokens/s with speculation (goal >= 1.8x: {goal}).

| batch | off tok/s (median) | ngram tok/s (median) | on / off (median of per-run ratios) | runs | acceptance |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

{where}

```sh
BUILD_DIR=build scripts/bench/run_all.sh speculative
```
<!-- END speculative -->
"""


if __name__ == "__main__":
    main()
