#!/usr/bin/env python3
"""Long prompts arriving while decode streams run, against an OpenAI /v1/completions server:
inter-token latency and goodput under a TTFT / ITL SLO (scripts/bench/gpu_disagg.sh).

  slo_client.py --url http://127.0.0.1:PORT --decode-streams C --duration S
                [--decode-prompt-len 128] [--decode-output-len 256]
                [--long-rate 0.5] [--long-prompt-len 2048] [--long-output-len 16]
                [--ttft-slo-ms 2000] [--itl-slo-ms 50] [--seed 0] [--json-out FILE] [--label T]

Two loads at once, for --duration seconds (requests started in that window run to their end):
  decode  C closed-loop streams, each sending its next request when the last one ended: short
          prompts, long outputs (the decode load whose inter-token latency a long prefill hurts);
  long    Poisson arrivals at --long-rate requests/s of long prompts with short outputs.
Every prompt is its own random token ids (no prefix-cache hits), streamed, greedy, ignore_eos.

Per request: TTFT (sent to first token event) and every gap between consecutive token events.
Per load: requests, failures, TTFT p50/p99, ITL p50/p99/max over all its gaps, output tokens.
Goodput (vLLM's sense): a request is good when its TTFT <= --ttft-slo-ms and its own ITL p99
<= --itl-slo-ms (a one-token request: TTFT only); goodput = good requests per second and their
output tokens per second over the run's wall time (first send to last token). One asyncio loop
(no threads), so the client's own delay stays far below the gaps it measures. Python's standard
library only; prints one JSON line, --json-out writes it too; exit 1 when a request failed.
"""

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q / 100.0 * (len(values) - 1)))))
    return values[k]


async def read_body_lines(reader, chunked):
    """Yields the response body's lines (bytes, without the line end)."""
    buf = b""
    while True:
        if chunked:
            size_line = await reader.readline()
            if not size_line:
                break
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            buf += data[:-2]
        else:
            data = await reader.read(65536)
            if not data:
                break
            buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.rstrip(b"\r")
    if buf:
        yield buf


async def one_request(url, args, prompt, max_tokens, kind, out):
    parsed = urllib.parse.urlparse(url)
    body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    rec = {"kind": kind, "sent": time.monotonic(), "gaps": []}
    out.append(rec)
    writer = None
    try:
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (parsed.netloc.encode(), len(body)) + body)
        await writer.drain()
        status = (await reader.readline()).split()
        chunked = False
        while True:
            h = (await reader.readline()).strip().lower()
            if not h:
                break
            if h.startswith(b"transfer-encoding:") and b"chunked" in h:
                chunked = True
        if len(status) < 2 or status[1] != b"200":
            rec["error"] = f"HTTP {status[1:2]}"
            return
        last = None
        tokens = None
        events = 0
        async for line in read_body_lines(reader, chunked):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                rec["error"] = str(event["error"])[:300]
                return
            now = time.monotonic()
            if event.get("choices"):
                if last is None:
                    rec["ttft_ms"] = (now - rec["sent"]) * 1e3
                else:
                    rec["gaps"].append((now - last) * 1e3)
                last = now
                events += 1
            usage = event.get("usage")
            if usage and usage.get("completion_tokens"):
                tokens = usage["completion_tokens"]
        if last is None:
            rec["error"] = "no token events"
            return
        rec["end"] = last
        rec["tokens"] = tokens or events
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()


def make_prompt(rng, n, vocab):
    return [rng.randint(100, vocab - 1) for _ in range(n)]


async def run(args):
    rng = random.Random(args.seed)
    records = []
    start = time.monotonic()
    stop_at = start + args.duration

    async def decode_stream():
        while time.monotonic() < stop_at:
            await one_request(args.url, args, make_prompt(rng, args.decode_prompt_len,
                                                          args.vocab_size),
                              args.decode_output_len, "decode", records)

    async def long_arrivals():
        pending = []
        t = start
        while args.long_rate > 0:
            t += rng.expovariate(args.long_rate)
            if t >= stop_at:
                break
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            pending.append(asyncio.ensure_future(one_request(
                args.url, args, make_prompt(rng, args.long_prompt_len, args.vocab_size),
                args.long_output_len, "long", records)))
        if pending:
            await asyncio.gather(*pending)

    await asyncio.gather(long_arrivals(), *(decode_stream() for _ in range(args.decode_streams)))
    return start, records


def summarize(args, start, records):
    done = [r for r in records if "error" not in r]
    errors = [r["error"] for r in records if "error" in r]
    wall = (max(r["end"] for r in done) - start) if done else 0.0
    report = {"label": args.label, "decode_streams": args.decode_streams,
              "duration_s": args.duration, "long_rate": args.long_rate,
              "decode_prompt_len": args.decode_prompt_len,
              "decode_output_len": args.decode_output_len,
              "long_prompt_len": args.long_prompt_len, "long_output_len": args.long_output_len,
              "ttft_slo_ms": args.ttft_slo_ms, "itl_slo_ms": args.itl_slo_ms,
              "requests": len(records), "completed": len(done), "errors": errors[:5],
              "failed": len(errors), "wall_s": wall}
    for kind in ("decode", "long"):
        rs = [r for r in done if r["kind"] == kind]
        gaps = [g for r in rs for g in r["gaps"]]
        ttfts = [r["ttft_ms"] for r in rs]
        report[kind] = {
            "completed": len(rs), "output_tokens": sum(r["tokens"] for r in rs),
            "ttft_ms": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
            "itl_ms": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99),
                       "max": max(gaps) if gaps else None},
        }
    good = [r for r in done if r["ttft_ms"] <= args.ttft_slo_ms and
            (not r["gaps"] or percentile(r["gaps"], 99) <= args.itl_slo_ms)]
    tokens = sum(r["tokens"] for r in done)
    report.update({
        "output_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "good_requests": len(good),
        "goodput_requests_per_s": len(good) / wall if wall > 0 else 0.0,
        "goodput_tokens_per_s": sum(r["tokens"] for r in good) / wall if wall > 0 else 0.0,
        "good_fraction": len(good) / len(done) if done else 0.0,
    })
    return report, errors


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--decode-streams", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--decode-prompt-len", type=int, default=128)
    p.add_argument("--decode-output-len", type=int, default=256)
    p.add_argument("--long-rate", type=float, default=0.5)
    p.add_argument("--long-prompt-len", type=int, default=2048)
    p.add_argument("--long-output-len", type=int, default=16)
    p.add_argument("--ttft-slo-ms", type=float, default=2000)
    p.add_argument("--itl-slo-ms", type=float, default=50)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="")
    p.add_argument("--json-out", default="")
    args = p.parse_args()
    start, records = asyncio.run(run(args))
    report, errors = summarize(args, start, records)
    line = json.dumps(report)
    print(line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    if errors or not report["completed"]:
        print(f"slo_client: {len(errors)} request(s) failed: {errors[:1]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
