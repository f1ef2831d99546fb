#!/usr/bin/env bash
# A/B of the KV secret's cost on the disaggregated serving path (issue 41: the handshake is once
# per connection, the transfer key one HMAC per transfer). Clusters of the random llama-110m bf16
# model (start_cluster of cluster.sh: prefill worker, decode worker, router), with the default KV
# secret (--kv-secret-file) or with --allow-unauthenticated-kv, one at a time: each repetition
# starts a fresh cluster of each kind in turn, the order alternating (A B, then B A, ...), so
# neither kind always runs first or on the second-started processes (with both clusters up at
# once, the one started second ran 2-6x slower here whichever it was). BENCH_REPS (default 5)
# repetitions of, after a warm-up that makes the connections:
#   ttft: TTFT_REQUESTS (3) prompts of TTFT_PROMPT_LEN (512) tokens, one at a time (the KV
#         transfer is on the TTFT path);
#   load: LOAD_REQUESTS (12) requests, 4 at a time, 128-token prompts, 16 new tokens.
# Prints a markdown table of the medians over repetitions and their ratio (secret / open); the
# per-run JSON stays in the work dir with BENCH_KEEP_WORK=1.
#   scripts/bench/kv_secret_ab.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cluster.sh"
bench_init kv_secret_ab
REPS="${BENCH_REPS:-5}"
MODEL="$(ensure_model llama-110m)"
ENGINE=(--model "$MODEL" --dtype bf16 --max-model-len 4096)
THREADS=(--threads "${BENCH_THREADS:-1}")
head -c 32 /dev/urandom | base64 >"$WORK/kv.secret"
chmod 600 "$WORK/kv.secret"

TTFT=(--num-requests "${TTFT_REQUESTS:-3}" --concurrency 1 --prompt-len "${TTFT_PROMPT_LEN:-512}"
      --output-len 4 --sample-interval 0)
LOAD=(--num-requests "${LOAD_REQUESTS:-12}" --concurrency 4 --prompt-len 128 --output-len 16
      --sample-interval 0)
# run_one NAME REP: a fresh cluster (secret: the default KV secret; open:
# --allow-unauthenticated-kv), a warm-up that makes its connections, the two workloads, stop.
run_one() {
  if [ "$1" = secret ]; then KV_SECRET=(--kv-secret-file "$WORK/kv.secret"); else
    KV_SECRET=(--allow-unauthenticated-kv); fi
  start_cluster "$1-$2" "" "" "${THREADS[@]}"
  local target="127.0.0.1:$LAST_PORT"
  "$TANDEM" bench --target "$target" --num-requests 2 --concurrency 2 --prompt-len 128 \
    --output-len 4 --seed 999 --quiet --progress-interval 0 --sample-interval 0 >/dev/null
  run_bench "$WORK/ttft-$1.$2.json" --target "$target" --label "$1 ttft $2" --seed "$2" "${TTFT[@]}"
  run_bench "$WORK/load-$1.$2.json" --target "$target" --label "$1 load $2" --seed "$((100 + $2))" \
    "${LOAD[@]}"
  local pid
  for pid in "${CLUSTER_PIDS[@]}"; do stop_process "$pid"; done
}
for rep in $(seq 1 "$REPS"); do
  log "repetition $rep/$REPS"
  if [ $((rep % 2)) = 1 ]; then
    run_one secret "$rep"
    run_one open "$rep"
  else
    run_one open "$rep"
    run_one secret "$rep"
  fi
done

/usr/bin/python3 - "$WORK" "$REPS" <<'PY'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def load(kind, name, rep):
    return json.load(open(f"{work}/{kind}-{name}.{rep}.json"))
rows = [
    ("long-prompt TTFT mean (ms)", "ttft", lambda j: j["ttft_ms"]["mean"]),
    ("long-prompt TTFT p90 (ms)", "ttft", lambda j: j["ttft_ms"]["p90"]),
    ("load TTFT p50 (ms)", "load", lambda j: j["ttft_ms"]["p50"]),
    ("load inter-token p50 (ms)", "load", lambda j: j["itl_ms"]["p50"]),
    ("load output tok/s", "load", lambda j: j["throughput"]["output_tokens_per_s"]),
    ("load requests/s", "load", lambda j: j["throughput"]["requests_per_s"]),
]
print(f"| metric (median of {reps} runs) | KV secret (default) | --allow-unauthenticated-kv "
      "| ratio of medians | median of per-run ratios | per-run ratios |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for label, kind, get in rows:
    a = [get(load(kind, "secret", r)) for r in range(1, reps + 1)]
    b = [get(load(kind, "open", r)) for r in range(1, reps + 1)]
    ratios = sorted(x / y for x, y in zip(a, b) if y)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {label} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} | {statistics.median(ratios):.3f} | "
          f"{', '.join(f'{x:.2f}' for x in ratios)} |")
PY
