#!/usr/bin/env bash
# Section "continuous batching and paged KV": tandem bench against three servers on the random
# llama-110m bf16 model, one with continuous batching (fcfs), one with the static-batching
# baseline (fixed shape: finished members stay as padding rows) and one with static-compact
# (finished members leave the batch), identical otherwise. The baselines are benchmark-only
# scheduling policies (tests/bench/static_batching): all three run tandem_bench_serve, which is
# `tandem serve` that also accepts them.
#  1. Throughput on a mixed-length, decode-heavy workload (the same seed gives every server the
#     same requests), the servers interleaved, repeated.
#  2. KV waste: the paged pool against the static reservation and a reserve-max-length
#     baseline, sampled during the runs of 1 and during one run of long-prompt requests.
#  3. Step costs on this machine (why the ratio is what it is): before each repetition, the
#     continuous server runs 1, 4 and 16 equal requests that start together (decode step time
#     = inter-token p50 at that batch) and 128-token prompts one at a time (prefill time = TTFT
#     p50 of 4).
# Writes $BENCH_RESULTS/batching.{md,json}. About 17 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init batching
REPS="${BENCH_REPS:-3}"
MODEL="$(ensure_model llama-110m)"
BENCH_SERVE="$BUILD_DIR/bin/tandem_bench_serve"
[ -x "$BENCH_SERVE" ] || {
  echo "batching: $BENCH_SERVE not built (ninja -C $BUILD_DIR tandem_bench_serve)" >&2
  exit 1
}
start_bench_serve() {
  local name="$1"
  shift
  record "server $name" "$BENCH_SERVE" --port 0 --port-file "$WORK/$name.port" "$@"
  start_process "$name" "$WORK/$name.port" "$BENCH_SERVE" --port 0 --port-file "$WORK/$name.port" "$@"
  log "$name serving on port $LAST_PORT (pid $LAST_PID)"
}

# One compute thread per server (BENCH_THREADS): the step costs below are then those of one
# core, and the three servers cannot take cores from each other's measurements.
SERVER=(--model "$MODEL" --dtype bf16 --threads "${BENCH_THREADS:-1}" --max-num-seqs 16
        --max-num-batched-tokens 8192 --kv-cache-memory 1GiB --block-size 16)
THROUGHPUT=(--duration "${BATCHING_SECONDS:-90}" --concurrency 16 --prompt-len uniform:16:128
            --output-len lognormal:96:1.0:512 --sample-interval 0.25 --block-size 16)
LONG=(--num-requests 16 --concurrency 16 --prompt-len uniform:256:768
      --output-len lognormal:64:1.0:256 --sample-interval 0.25 --block-size 16)
start_bench_serve continuous "${SERVER[@]}" --scheduling-policy fcfs
CONTINUOUS="127.0.0.1:$LAST_PORT"
start_bench_serve static "${SERVER[@]}" --scheduling-policy static
STATIC="127.0.0.1:$LAST_PORT"
start_bench_serve compact "${SERVER[@]}" --scheduling-policy static-compact
COMPACT="127.0.0.1:$LAST_PORT"
for target in "$CONTINUOUS" "$STATIC" "$COMPACT"; do  # touch the weights and code paths once
  "$TANDEM" bench --target "$target" --num-requests 2 --prompt-len 16 --output-len 8 \
    --quiet --progress-interval 0 --sample-interval 0
done

for rep in $(seq 1 "$REPS"); do
  log "step costs, repetition $rep/$REPS"
  for batch in 1 4 16; do
    run_bench "$WORK/step-$batch.$rep.json" --target "$CONTINUOUS" --label "decode step, $batch" \
      --seed "$rep" --num-requests "$batch" --concurrency "$batch" --prompt-len 16 \
      --output-len 64 --sample-interval 0
  done
  run_bench "$WORK/prefill.$rep.json" --target "$CONTINUOUS" --label "prefill 128" \
    --seed "$rep" --num-requests 4 --concurrency 1 --prompt-len 128 --output-len 2 \
    --sample-interval 0
  log "throughput, repetition $rep/$REPS"
  run_bench "$WORK/continuous.$rep.json" --target "$CONTINUOUS" --label "continuous $rep" \
    --seed "$rep" "${THROUGHPUT[@]}"
  run_bench "$WORK/static.$rep.json" --target "$STATIC" --label "static $rep" \
    --seed "$rep" "${THROUGHPUT[@]}"
  run_bench "$WORK/compact.$rep.json" --target "$COMPACT" --label "static-compact $rep" \
    --seed "$rep" "${THROUGHPUT[@]}"
done
log "KV waste, long prompts"
run_bench "$WORK/long-continuous.json" --target "$CONTINUOUS" --label "long prompts, continuous" \
  --seed 1 "${LONG[@]}"
run_bench "$WORK/long-static.json" --target "$STATIC" --label "long prompts, static" \
  --seed 1 "${LONG[@]}"
render batching "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/batching.md"
