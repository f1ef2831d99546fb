#!/usr/bin/env bash
# A/B of the KV secret's cost on the disaggregated serving path (issue 41: the handshake is once
# per connection, the transfer key one HMAC per transfer). Two clusters of the random llama-110m
# bf16 model (start_cluster of cluster.sh: prefill worker, decode worker, router), one with the
# default KV secret (--kv-secret-file), one with --allow-unauthenticated-kv, both up at once and
# measured in alternation (A B, then B A, ...), BENCH_REPS times (default 5):
#   ttft: TTFT_REQUESTS (3) prompts of TTFT_PROMPT_LEN (512) tokens, one at a time (the KV
#         transfer is on the TTFT path);
#   load: LOAD_REQUESTS (12) requests, 4 at a time, 128-token prompts, 16 new tokens.
# Prints a markdown table of the medians over repetitions and their ratio (secret / open); the
# per-run JSON stays in the work dir with BENCH_KEEP_WORK=1. About 10 minutes on 2 busy cores.
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

KV_SECRET=(--kv-secret-file "$WORK/kv.secret")
start_cluster secret "" "" "${THREADS[@]}"
SECRET="127.0.0.1:$LAST_PORT"
KV_SECRET=(--allow-unauthenticated-kv)
start_cluster open "" "" "${THREADS[@]}"
OPEN="127.0.0.1:$LAST_PORT"

TTFT=(--num-requests "${TTFT_REQUESTS:-3}" --concurrency 1 --prompt-len "${TTFT_PROMPT_LEN:-512}"
      --output-len 4 --sample-interval 0)
LOAD=(--num-requests "${LOAD_REQUESTS:-12}" --concurrency 4 --prompt-len 128 --output-len 16
      --sample-interval 0)
for target in "$SECRET" "$OPEN"; do  # connections made, caches warm
  "$TANDEM" bench --target "$target" --num-requests 2 --concurrency 2 --prompt-len 128 \
    --output-len 4 --seed 999 --quiet --progress-interval 0 --sample-interval 0 >/dev/null
done
run_one() {  # run_one NAME TARGET REP
  run_bench "$WORK/ttft-$1.$3.json" --target "$2" --label "$1 ttft $3" --seed "$3" "${TTFT[@]}"
  run_bench "$WORK/load-$1.$3.json" --target "$2" --label "$1 load $3" --seed "$((100 + $3))" \
    "${LOAD[@]}"
}
for rep in $(seq 1 "$REPS"); do
  log "repetition $rep/$REPS"
  if [ $((rep % 2)) = 1 ]; then
    run_one secret "$SECRET" "$rep"
    run_one open "$OPEN" "$rep"
  else
    run_one open "$OPEN" "$rep"
    run_one secret "$SECRET" "$rep"
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
      "| ratio | spread of per-run ratios |")
print("| --- | ---: | ---: | ---: | --- |")
for label, kind, get in rows:
    a = [get(load(kind, "secret", r)) for r in range(1, reps + 1)]
    b = [get(load(kind, "open", r)) for r in range(1, reps + 1)]
    ratios = sorted(x / y for x, y in zip(a, b) if y)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {label} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} | "
          f"{ratios[0]:.2f} .. {ratios[-1]:.2f} |")
PY
