#!/usr/bin/env bash
# Section "disaggregated prefill/decode" on the random llama-110m bf16 model:
#  1. KV transfer throughput over TCP on loopback (kvtransfer_bench);
#  2. the TTFT split (queue, prefill, KV transfer, first decode) of 2k-token prompts through a
#     prefill worker + decode worker + router, with layer-wise KV push and without it
#     (--no-layerwise-push), the two clusters interleaved;
#  3. inter-token latency of a steady decode load while long prompts keep arriving:
#     monolithic `tandem serve` (one compute thread, and one per core) vs the disaggregated
#     cluster (prefill worker pinned to core 0, decode worker to core 1, one thread each).
# Workers run one compute thread (--threads 1): on this shared 2-core machine the engine's
# 2-thread pool loses more than half its speed whenever another process takes a core.
# Writes $BENCH_RESULTS/disagg.{md,json}. About 8 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cluster.sh"
bench_init disagg
REPS="${BENCH_REPS:-2}"
MODEL="$(ensure_model llama-110m)"
KVT="$BUILD_DIR/bin/kvtransfer_bench"
[ -x "$KVT" ] || { echo "build kvtransfer_bench first: ninja -C $BUILD_DIR kvtransfer_bench" >&2; exit 1; }
ENGINE=(--model "$MODEL" --dtype bf16 --max-model-len 4096)
THREADS=(--threads "${BENCH_THREADS:-1}")
# The workers' KV data path authenticates as every cluster's does (a secret both hold).
head -c 32 /dev/urandom | base64 >"$WORK/kv.secret"
chmod 600 "$WORK/kv.secret"
KV_SECRET=(--kv-secret-file "$WORK/kv.secret")

STOP=()
stop_cluster() {
  local pid
  for pid in "$@"; do stop_process "$pid"; done
}

# 1. KV transfer throughput.
record "KV transfer throughput" "$KVT" --seconds=2 --transport=tcp
for rep in $(seq 1 "$REPS"); do
  "$KVT" --seconds=2 --transport=tcp >"$WORK/kvtransfer.$rep.txt"
done

# 2. TTFT split of 2k-token prompts, layer-wise push vs whole-prompt push.
start_cluster layerwise "" "" "${THREADS[@]}"
LAYERWISE="127.0.0.1:$LAST_PORT"
LAYERWISE_PIDS=("${CLUSTER_PIDS[@]}")
start_cluster whole "" "" "${THREADS[@]}" --no-layerwise-push
WHOLE="127.0.0.1:$LAST_PORT"
WHOLE_PIDS=("${CLUSTER_PIDS[@]}")
TTFT=(--num-requests "${TTFT_REQUESTS:-3}" --concurrency 1 --prompt-len 2048 --output-len 4
      --sample-interval 0)
for rep in $(seq 1 "$REPS"); do
  log "TTFT split, repetition $rep/$REPS"
  warm=0
  [ "$rep" = 1 ] && warm=1
  run_bench "$WORK/ttft-layerwise.$rep.json" --target "$LAYERWISE" --label "layer-wise $rep" \
    --seed "$rep" --warmup-requests "$warm" "${TTFT[@]}"
  run_bench "$WORK/ttft-whole.$rep.json" --target "$WHOLE" --label "whole prompt $rep" \
    --seed "$rep" --warmup-requests "$warm" "${TTFT[@]}"
done
stop_cluster "${LAYERWISE_PIDS[@]}" "${WHOLE_PIDS[@]}"

# 3. Inter-token latency of a decode load while long prompts arrive.
ITL_SECONDS="${ITL_SECONDS:-40}"
DECODE_LOAD=(--concurrency 4 --prompt-len 32 --output-len 64 --duration "$ITL_SECONDS"
             --sample-interval 0)
LONG_PROMPTS=(--request-rate "${LONG_PROMPT_RATE:-0.2}" --concurrency 2 --prompt-len 1024
              --output-len 1 --duration "$ITL_SECONDS" --sample-interval 0)
interference() {  # interference NAME TARGET REP
  run_bench "$WORK/itl-$1-decode.$3.json" --target "$2" --label "$1 decode load $3" \
    --seed "$3" "${DECODE_LOAD[@]}" &
  local decode_pid=$!
  run_bench "$WORK/itl-$1-long.$3.json" --target "$2" --label "$1 long prompts $3" \
    --seed "$((100 + $3))" "${LONG_PROMPTS[@]}"
  wait "$decode_pid"
}
PIN0="" PIN1=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN0="taskset -c 0" PIN1="taskset -c 1"; fi
CONFIGS=()
MONO_THREADS="${MONO_THREADS:-$(printf '%s\n' 1 "$(nproc)" | sort -un | tr '\n' ' ')}"
for t in $MONO_THREADS; do
  start_serve "monolithic-t$t" "${ENGINE[@]}" --threads "$t"
  CONFIGS+=("monolithic-t$t=127.0.0.1:$LAST_PORT")
  STOP+=("$LAST_PID")
done
start_cluster pinned "$PIN0" "$PIN1" "${THREADS[@]}"
CONFIGS+=("disaggregated=127.0.0.1:$LAST_PORT")
STOP+=("${CLUSTER_PIDS[@]}")
for rep in $(seq 1 "$REPS"); do
  log "interference, repetition $rep/$REPS"
  for c in "${CONFIGS[@]}"; do interference "${c%%=*}" "${c#*=}" "$rep"; done
done
stop_cluster "${STOP[@]}"

render disagg "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/disagg.md"
