#!/usr/bin/env bash
# Section "KV cache tiers": two `tandem serve` processes on the random llama-110m bf16 model with
# the same small KV pool, identical but for --kv-offload-dir (the disk tier) on one, driven side
# by side by scripts/bench/kv_tiers.py with an interleaved multi-turn chat trace whose KV working
# set is about 4x the pool (64 blocks). Then the tiered server is
# stopped with SIGTERM and restarted on the same directory, and the next turn of known sessions
# is timed against a warm hit. Writes $BENCH_RESULTS/kv_tiers.{md,json}. About 6 minutes with the
# defaults (8 sessions x 4 turns, 2 repetitions) on a 2-core VM.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init kv_tiers
MODEL="$(ensure_model llama-110m)"
POOL="${KV_TIERS_POOL_BLOCKS:-64}"
SERVER=(--model "$MODEL" --dtype bf16 --threads "${BENCH_THREADS:-1}" --max-num-seqs 8
        --num-kv-blocks "$POOL" --block-size 16)
TIERS=(--kv-offload-dir "$WORK/kv" --kv-offload-disk-size 4GiB)
start_serve off "${SERVER[@]}"
OFF="127.0.0.1:$LAST_PORT"
OFF_PID=$LAST_PID
start_serve on "${SERVER[@]}" "${TIERS[@]}"
ON="127.0.0.1:$LAST_PORT"
ON_PID=$LAST_PID
DRIVER=(/usr/bin/python3 "$ROOT/scripts/bench/kv_tiers.py" --pool-blocks "$POOL"
        --reps "${BENCH_REPS:-2}" --sessions "${KV_TIERS_SESSIONS:-8}" --turns "${KV_TIERS_TURNS:-4}"
        --system-tokens "${KV_TIERS_SYSTEM:-128}" --user-tokens "${KV_TIERS_USER:-64}"
        --answer-tokens "${KV_TIERS_ANSWER:-32}" --concurrency "${KV_TIERS_CONCURRENCY:-4}"
        --work "$WORK" --out "$BENCH_RESULTS")
record "driver" "${DRIVER[@]}" --phase trace --off "$OFF" --on "$ON"
"${DRIVER[@]}" --phase trace --off "$OFF" --on "$ON"
stop_process "$OFF_PID"
log "restarting the tiered server on $WORK/kv"
stop_process "$ON_PID"
start_serve on-restarted "${SERVER[@]}" "${TIERS[@]}"
record "driver" "${DRIVER[@]}" --phase restart --on "127.0.0.1:$LAST_PORT"
"${DRIVER[@]}" --phase restart --on "127.0.0.1:$LAST_PORT"
"${DRIVER[@]}" --phase render
log "wrote $BENCH_RESULTS/kv_tiers.md"
