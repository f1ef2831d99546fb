#!/usr/bin/env bash
# Section "serving curve": aggregate decode throughput and time to first token through
# `tandem serve` (router + engine in one process, all cores) at rising concurrency, on the
# random llama-110m and llama-1b models in bf16 / int8 / int4, with the peer's server workload:
# 128-token prompts, 128 new tokens (ignore_eos), one wave of C requests started together at
# concurrency C. One server at a time (each takes every core). Token budget per step 256: the
# prompts of a wave are prefilled a few per step, so the first ones answer sooner; on two cores a
# 256-token step already keeps the kernels busy (compare budgets with serve_budget_ab.sh).
# Each server runs BENCH_REPS rounds (default 3) of the whole sweep, so that a slow moment of
# this machine lands on one round's points, not on one point: the report takes medians per point
# and the c=16 / c=1 ratio of each round (two waves a few seconds apart on one server).
#   SERVE_FORMATS_110M="none int8 int4" SERVE_FORMATS_1B="int8 int4" scripts/bench/serve_curve.sh
# Writes $BENCH_RESULTS/serve_curve.{md,json}. About 5 minutes (the random models made once).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init serve_curve
FORMATS_110M=(${SERVE_FORMATS_110M:-none int8 int4})
FORMATS_1B=(${SERVE_FORMATS_1B:-int8 int4})
CONC_110M=(${SERVE_CONC_110M:-1 4 8 16 32})
CONC_1B=(${SERVE_CONC_1B:-1 4 8 16})
REPS="${BENCH_REPS:-3}"
echo "$REPS" >"$WORK/reps.txt"

run_model() {
  local preset="$1" dir
  shift
  dir="$(ensure_model "$preset")"
  local -n formats="$1" concurrencies="$2"
  for fmt in "${formats[@]}"; do
    local name="$preset.$fmt"
    start_serve "$name" --model "$dir" --dtype bf16 --quantization "$fmt" --threads 0 \
      --max-num-seqs 32 --max-num-batched-tokens 256 --kv-cache-memory 2GiB
    local target="127.0.0.1:$LAST_PORT" pid="$LAST_PID"
    # Warm-up at the measured shape (first-touch of scratch and KV pages). Every wave draws
    # prompts with its own seed: waves that repeated earlier prompts would hit the prefix cache.
    "$TANDEM" bench --target "$target" --num-requests 2 --concurrency 2 --prompt-len 128 \
      --output-len 16 --seed 999 --quiet --progress-interval 0 --sample-interval 0
    for rep in $(seq 1 "$REPS"); do
      for c in "${concurrencies[@]}"; do
        run_bench "$WORK/$name.c$c.$rep.json" --target "$target" \
          --label "$preset $fmt c=$c" --num-requests "$c" --concurrency "$c" \
          --prompt-len 128 --output-len 128 --seed $((1000 * rep + c)) --sample-interval 0
      done
    done
    stop_process "$pid"
  done
}
run_model llama-110m FORMATS_110M CONC_110M
run_model llama-1b FORMATS_1B CONC_1B
render serve_curve "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/serve_curve.md"
