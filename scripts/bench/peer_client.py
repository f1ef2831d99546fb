#!/usr/bin/env python3
"""One benchmark client for Tandem and llama.cpp's server: both speak OpenAI's /v1/completions.

  peer_client.py --url http://127.0.0.1:PORT --concurrency C [--num-requests N]
                 [--prompt-len 128] [--output-len 128] [--prefix-len 0] [--seed S]
                 [--json-out FILE] [--label TEXT]

Each request is a streamed completion of a prompt given as token ids (so both servers see the
same tokens whatever their tokenizers do) with max_tokens = output-len, ignore_eos and greedy
sampling. N requests (default C) run on C threads, started together: one wave, like
`tandem bench --num-requests C --concurrency C`. With --prefix-len P every prompt is one P-token
prefix shared by the wave followed by prompt-len tokens of its own.

Per request: TTFT (send to first token event), TPOT ((last event - first event) / (tokens - 1))
and the token count (usage.completion_tokens, else llama.cpp's timings.predicted_n, else the
number of token events). Per wave: aggregate output tokens/s (all tokens / wave wall time).
Prints one JSON line; --json-out writes it too. Python's standard library only.
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def make_prompts(args):
    rng = random.Random(args.seed)
    vocab_lo, vocab_hi = 100, args.vocab_size - 1
    prefix = [rng.randint(vocab_lo, vocab_hi) for _ in range(args.prefix_len)]
    count = args.num_requests + (1 if args.warm_prefix else 0)
    return [prefix + [rng.randint(vocab_lo, vocab_hi) for _ in range(args.prompt_len)]
            for _ in range(count)]


def one_request(url, args, prompt, start_gate, result, max_tokens):
    parsed = urllib.parse.urlparse(url)
    body = json.dumps({
        "model": args.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=args.timeout)
    start_gate.wait()
    sent = time.monotonic()
    first = last = None
    events = 0
    text = []
    tokens = None
    try:
        # A wave's connections arrive at once; a busy server's listen queue can overflow and
        # the kernel resets a connection before the server has seen the request. Such a request
        # is sent again (its TTFT still counts from the first attempt).
        for attempt in range(4):
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                break
            except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError):
                conn.close()
                if attempt == 3:
                    raise
                time.sleep(0.2 * (attempt + 1))
        if resp.status != 200:
            result["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators and keep-alive comments
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                result["error"] = str(event["error"])[:300]
                return
            now = time.monotonic()
            if event.get("choices"):
                text.append(event["choices"][0].get("text") or "")
                if first is None:
                    first = now
                last = now
                events += 1
            usage = event.get("usage")
            if usage and usage.get("completion_tokens"):
                tokens = usage["completion_tokens"]
            timings = event.get("timings")
            if tokens is None and timings and timings.get("predicted_n"):
                tokens = timings["predicted_n"]
    except (OSError, http.client.HTTPException, ValueError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
        return
    finally:
        conn.close()
    if first is None:
        result["error"] = "no token events"
        return
    tokens = tokens or events
    result.update({
        "sent": sent,
        "ttft_ms": (first - sent) * 1e3,
        "tpot_ms": (last - first) * 1e3 / (tokens - 1) if tokens > 1 else 0.0,
        "end": last,
        "tokens": tokens,
        "text": "".join(text),
    })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--num-requests", type=int, default=0)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=0)
    p.add_argument("--warm-prefix", action="store_true",
                   help="first send one unmeasured request with the prefix (and its own tokens)")
    p.add_argument("--keep-text", action="store_true", help="put the generated texts in the report")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--label", default="")
    p.add_argument("--json-out", default="")
    args = p.parse_args()
    args.num_requests = args.num_requests or args.concurrency

    prompts = make_prompts(args)
    if args.warm_prefix:
        # The prefix's own request, alone and first, so the server has cached the prefix.
        warm, warm_prompt, prompts = {}, prompts[0], prompts[1:]
        ready = threading.Event()
        ready.set()
        one_request(args.url, args, warm_prompt, ready, warm, 1)
        if "error" in warm:
            sys.exit(f"peer_client: warm-up request failed: {warm['error']}")
    results = [{} for _ in prompts]
    gate = threading.Event()
    next_index = iter(range(len(prompts)))
    index_lock = threading.Lock()

    def worker():
        while True:
            with index_lock:
                i = next(next_index, None)
            if i is None:
                return
            one_request(args.url, args, prompts[i], gate, results[i], args.output_len)

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    wave_start = time.monotonic()
    gate.set()
    for t in threads:
        t.join()

    errors = [r["error"] for r in results if "error" in r]
    done = [r for r in results if "error" not in r]
    report = {"label": args.label, "concurrency": args.concurrency,
              "num_requests": args.num_requests, "prompt_len": args.prompt_len,
              "prefix_len": args.prefix_len, "output_len": args.output_len,
              "errors": errors, "completed": len(done)}
    if done:
        wall = max(r["end"] for r in done) - wave_start
        total = sum(r["tokens"] for r in done)
        report.update({
            "ttft_ms_median": statistics.median(r["ttft_ms"] for r in done),
            "tpot_ms_median": statistics.median(r["tpot_ms"] for r in done),
            "output_tokens": total,
            "short_outputs": sum(1 for r in done if r["tokens"] != args.output_len),
            "wall_s": wall,
            "output_tokens_per_s": total / wall if wall > 0 else 0.0,
        })
        if args.keep_text:
            report["texts"] = [r["text"] for r in done]
    line = json.dumps(report)
    print(line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    if errors:
        print(f"peer_client: {len(errors)} request(s) failed: {errors[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
