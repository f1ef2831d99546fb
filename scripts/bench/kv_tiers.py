#!/usr/bin/python3
"""KV cache tiers on vs off, side by side (driven by scripts/bench/kv_tiers.sh).

Phase `trace`: two servers identical but for the tiers (--kv-offload-host-memory and
--kv-offload-dir on one). A multi-turn chat trace: S sessions, each a random system prompt, then
T turns each adding U user tokens and the model's A-token answer; the sessions interleave (every
session's turn t, C at a time, before any turn t+1), so the KV working set (S sessions' histories)
outgrows the pool and a session's next turn finds its history evicted. The same trace goes to
one server then the other (the order alternates per repetition; each repetition uses new
sessions). Reported per server: TTFT p50 of turns 2..T, TPOT p99 (inter-token time of a stream,
first to last token), output tokens/s over the whole trace, prompt tokens served from cache.
Every output of the tiered server must equal the other's.

Phase `restart`: against the tiered server restarted (SIGTERM, same --kv-offload-dir) after the
trace: the next turn of some known sessions reports its history as cached and its TTFT is
compared with a warm hit (the same request again, from the pool).
"""
import argparse
import concurrent.futures
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "e2e"))
import grpc  # noqa: E402

from tandem_testlib import load_stubs  # noqa: E402


def stream(stubs, stub, ids, max_tokens):
    """One greedy request; returns (output ids, ttft s, token times, cached prompt tokens)."""
    request = stubs.gen.GenerateRequest(
        token_ids=stubs.common.TokenIds(ids=ids),
        sampling=stubs.sampling.SamplingParams(temperature=0, max_tokens=max_tokens,
                                               ignore_eos=True))
    start = time.perf_counter()
    out, times, cached = [], [], 0
    for r in stub.Generate(request, timeout=600):
        if r.HasField("chunk") and r.chunk.token_ids:
            now = time.perf_counter()
            out.extend(r.chunk.token_ids)
            times.extend([now] * len(r.chunk.token_ids))
        elif r.HasField("final"):
            cached = r.final.usage.cached_tokens
    return out, times[0] - start, times, cached


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_trace(stubs, stub, sessions, args):
    """Runs the interleaved trace; returns metrics and every answer (session, turn) -> ids."""
    history = {s: list(p) for s, p in sessions["system"].items()}
    answers, ttft_later, tpot, cached, prompt = {}, [], [], 0, 0
    out_tokens = 0
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        for t in range(args.turns):
            for s in history:
                history[s] += sessions["user"][s][t]
            futs = {s: pool.submit(stream, stubs, stub, history[s], args.answer_tokens)
                    for s in history}
            for s, f in futs.items():
                ids, ttft, times, c = f.result()
                answers[(s, t)] = ids
                prompt += len(history[s])
                cached += c
                out_tokens += len(ids)
                if t > 0:
                    ttft_later.append(ttft)
                if len(times) > 1:
                    tpot.append((times[-1] - times[0]) / (len(times) - 1))
                history[s] += ids
    wall = time.perf_counter() - start
    return {"ttft_p50_later": pct(ttft_later, 0.5), "tpot_p99": pct(tpot, 0.99),
            "tok_s": out_tokens / wall, "cached_share": cached / prompt, "wall_s": wall}, \
        answers, history


def make_sessions(rng, args, rep):
    def toks(n):
        return [rng.randrange(3, args.vocab) for _ in range(n)]
    return {"system": {f"{rep}-{s}": [1] + toks(args.system_tokens) for s in range(args.sessions)},
            "user": {f"{rep}-{s}": [toks(args.user_tokens) for _ in range(args.turns + 1)]
                     for s in range(args.sessions)}}


def phase_trace(args, stubs):
    stub = {name: stubs.gen_grpc.GenerationStub(grpc.insecure_channel(addr))
            for name, addr in (("off", args.off), ("on", args.on))}
    for name in stub:  # warm-up: weights paged in, code paths touched
        stream(stubs, stub[name], [1] + list(range(5, 69)), 4)
    rng = random.Random(48)
    runs = {"off": [], "on": []}
    identical = True
    known = {}
    for rep in range(args.reps):
        sessions = make_sessions(rng, args, rep)
        order = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
        answers = {}
        for name in order:
            m, answers[name], history = run_trace(stubs, stub[name], sessions, args)
            runs[name].append(m)
            print(f"[kv_tiers] rep {rep + 1} {name}: TTFT p50 (turns 2+) "
                  f"{m['ttft_p50_later'] * 1000:.0f} ms, TPOT p99 {m['tpot_p99'] * 1000:.1f} ms, "
                  f"{m['tok_s']:.1f} tok/s, cached {m['cached_share']:.0%}",
                  file=sys.stderr, flush=True)
            if name == "on":
                known = {"history": history, "next": {s: sessions["user"][s][args.turns]
                                                      for s in history}}
        identical = identical and answers["on"] == answers["off"]
    with open(os.path.join(args.work, "kv_tiers_sessions.json"), "w") as f:
        json.dump(known, f)
    return {"runs": runs, "outputs_identical": identical}


def phase_restart(args, stubs):
    """The tiered server was restarted on its directory: the next turn of known sessions, its
    history read from disk, against the next turn of other known sessions whose history was made
    warm first (sent once, so that it sits in the pool): the same uncached work (the new user
    tokens), a pool hit instead of a disk load."""
    stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(args.on))
    known = json.load(open(os.path.join(args.work, "kv_tiers_sessions.json")))
    stream(stubs, stub, [1] + list(range(7, 71)), 4)  # warm-up: weights paged in
    cold, warm, cached, prompts = [], [], [], []
    names = sorted(known["history"])
    for i in range(args.restart_sessions):
        s, w = names[2 * i], names[2 * i + 1]
        ids = known["history"][s] + known["next"][s]
        first = stream(stubs, stub, ids, args.answer_tokens)
        stream(stubs, stub, known["history"][w], 1)  # its history into the pool
        hit = stream(stubs, stub, known["history"][w] + known["next"][w], args.answer_tokens)
        cold.append(first[1])
        warm.append(hit[1])
        cached.append(first[3])
        prompts.append(len(ids))
    return {"restart_ttft": cold, "warm_ttft": warm, "restart_cached": cached,
            "restart_prompt": prompts}


def phase_cluster(args, stubs):
    """Two local clusters (1 prefill + 2 decode workers, tiers on every worker), identical but
    for the router's prefix affinity: crediting blocks in the workers' tiers (by their measured
    load cost) or only blocks in their pools. The same interleaved trace goes to each; reported:
    the share of turns 2..T's prompt tokens served from cache."""
    stub = {name: stubs.gen_grpc.GenerationStub(grpc.insecure_channel(addr))
            for name, addr in (("tiers", args.on), ("pool_only", args.off))}
    for name in stub:
        stream(stubs, stub[name], [1] + list(range(5, 69)), 4)
    rng = random.Random(49)
    out = {"tiers": [], "pool_only": []}
    identical = True
    for rep in range(args.reps):
        sessions = make_sessions(rng, args, f"c{rep}")
        order = ["tiers", "pool_only"] if rep % 2 == 0 else ["pool_only", "tiers"]
        answers = {}
        for name in order:
            history = {s: list(p) for s, p in sessions["system"].items()}
            cached = prompt = 0
            answers[name] = {}
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                for t in range(args.turns):
                    for s in history:
                        history[s] += sessions["user"][s][t]
                    futs = {s: pool.submit(stream, stubs, stub[name], history[s],
                                           args.answer_tokens) for s in history}
                    for s, f in futs.items():
                        ids, _, _, c = f.result()
                        answers[name][(s, t)] = ids
                        if t > 0:
                            cached += c
                            prompt += len(history[s])
                        history[s] += ids
            out[name].append(cached / prompt)
            print(f"[kv_tiers] cluster rep {rep + 1} {name}: {cached / prompt:.0%} of turns 2+ "
                  f"prompt tokens cached", file=sys.stderr, flush=True)
        identical = identical and answers["tiers"] == answers["pool_only"]
    return {"cluster": out, "cluster_outputs_identical": identical,
            "cluster_shape": {k: getattr(args, k) for k in (
                "sessions", "turns", "system_tokens", "user_tokens", "answer_tokens",
                "concurrency", "pool_blocks")}}


def render_cluster(s):
    med = statistics.median
    c = s["cluster_shape"]
    return (f"1 prefill + 2 decode workers (local cluster), KV tiers on every worker, "
            f"{c['pool_blocks']}-block pools; {c['sessions']} sessions x {c['turns']} turns "
            f"(system {c['system_tokens']}, +{c['user_tokens']} user, {c['answer_tokens']} answer "
            f"tokens), {c['concurrency']} at a time. Prompt tokens of turns 2-{c['turns']} served "
            f"from cache: **{med(s['cluster']['tiers']):.0%}** with tier-aware prefix affinity "
            f"against {med(s['cluster']['pool_only']):.0%} with pool-only affinity "
            f"(`--no-tier-affinity`), medians of {len(s['cluster']['tiers'])} repetitions; "
            f"outputs identical: {s['cluster_outputs_identical']}.\n")


def render(s):
    med = statistics.median
    off, on = s["runs"]["off"], s["runs"]["on"]

    def m(runs, key):
        return med([r[key] for r in runs])

    ttft_ratio = [a["ttft_p50_later"] / b["ttft_p50_later"] for a, b in zip(off, on)]
    tok_ratio = [b["tok_s"] / a["tok_s"] for a, b in zip(off, on)]
    tpot_ratio = [b["tpot_p99"] / a["tpot_p99"] for a, b in zip(off, on)]
    lines = [
        f"Workload: {s['sessions']} sessions x {s['turns']} turns, system prompt "
        f"{s['system_tokens']} tokens, each turn +{s['user_tokens']} user and "
        f"{s['answer_tokens']} answer tokens, {s['concurrency']} requests at a time, sessions "
        f"interleaved; KV working set {s['working_set_blocks']} blocks against a pool of "
        f"{s['pool_blocks']} ({s['working_set_blocks'] / s['pool_blocks']:.1f}x). Medians of "
        f"{s['reps']} repetitions (ratios per repetition, then the median).",
        "",
        "| | tiers off | tiers on | on vs off (range) |",
        "| --- | ---: | ---: | --- |",
        f"| TTFT p50, turns 2-{s['turns']} | {m(off, 'ttft_p50_later') * 1000:.0f} ms | "
        f"{m(on, 'ttft_p50_later') * 1000:.0f} ms | **{med(ttft_ratio):.2f}x lower** "
        f"({min(ttft_ratio):.2f}-{max(ttft_ratio):.2f}) |",
        f"| output tok/s | {m(off, 'tok_s'):.1f} | {m(on, 'tok_s'):.1f} | {med(tok_ratio):.2f}x "
        f"({min(tok_ratio):.2f}-{max(tok_ratio):.2f}) |",
        f"| TPOT p99 | {m(off, 'tpot_p99') * 1000:.1f} ms | {m(on, 'tpot_p99') * 1000:.1f} ms | "
        f"{med(tpot_ratio):.2f}x ({min(tpot_ratio):.2f}-{max(tpot_ratio):.2f}) |",
        f"| prompt tokens from cache | {m(off, 'cached_share'):.0%} | "
        f"{m(on, 'cached_share'):.0%} | |",
        "",
        f"Outputs identical with the tiers on and off: {s['outputs_identical']}.",
    ]
    if "restart_ttft" in s:
        r = [a / b for a, b in zip(s["restart_ttft"], s["warm_ttft"])]
        share = sum(s["restart_cached"]) / sum(s["restart_prompt"])
        lines += ["", f"Restart (SIGTERM, then the same --kv-offload-dir): the next turn of "
                  f"{len(r)} known sessions had {share:.0%} of its prompt cached (from disk); "
                  f"TTFT {med(s['restart_ttft']) * 1000:.0f} ms against "
                  f"{med(s['warm_ttft']) * 1000:.0f} ms for the next turn of other known "
                  f"sessions whose history was in the pool (median ratio {med(r):.2f}x)."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["trace", "restart", "render", "cluster"], required=True)
    ap.add_argument("--off")
    ap.add_argument("--on", required=False)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=128)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pool-blocks", type=int, required=True)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--restart-sessions", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000, help="prompt token ids below this")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stubs = load_stubs()
    path = os.path.join(args.work, "kv_tiers.json")
    if args.phase == "trace":
        s = phase_trace(args, stubs)
        per_session = 1 + args.system_tokens + args.turns * (args.user_tokens + args.answer_tokens)
        s.update({k: getattr(args, k) for k in ("sessions", "turns", "system_tokens",
                                                 "user_tokens", "answer_tokens", "concurrency",
                                                 "reps", "pool_blocks")})
        s["working_set_blocks"] = args.sessions * (per_session // args.block_size)
        s["machine"] = open(os.path.join(args.work, "machine.txt")).read().strip()
        json.dump(s, open(path, "w"), indent=1)
        if not s["outputs_identical"]:
            sys.exit("kv_tiers: outputs differ between tiers on and off")
    elif args.phase == "restart":
        s = json.load(open(path))
        s.update(phase_restart(args, stubs))
        json.dump(s, open(path, "w"), indent=1)
    elif args.phase == "cluster":
        s = phase_cluster(args, stubs)
        with open(os.path.join(args.out, "kv_tiers_cluster.json"), "w") as f:
            json.dump(s, f, indent=1)
        with open(os.path.join(args.out, "kv_tiers_cluster.md"), "w") as f:
            f.write(render_cluster(s))
        print(render_cluster(s))
        if not s["cluster_outputs_identical"]:
            sys.exit("kv_tiers: cluster outputs differ between the two policies")
    else:
        s = json.load(open(path))
        with open(os.path.join(args.out, "kv_tiers.json"), "w") as f:
            json.dump(s, f, indent=1)
        with open(os.path.join(args.out, "kv_tiers.md"), "w") as f:
            f.write(render(s))
        print(render(s))


if __name__ == "__main__":
    main()
