#!/usr/bin/env bash
# Section "speculative decoding": two `tandem serve` processes on the random
# llama-110m bf16 model, identical but for --speculative-method (none vs ngram), driven side by
# side by scripts/bench/speculative.py with copy-heavy prompts at batch 1, 2, 4, 8 and 16.
# Writes $BENCH_RESULTS/speculative.{md,json}. About 5 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init speculative
MODEL="$(ensure_model llama-110m)"
SERVER=(--model "$MODEL" --dtype bf16 --threads "${BENCH_THREADS:-1}" --max-num-seqs 16
        --kv-cache-memory 1GiB --metrics-port=-1)
start_serve off "${SERVER[@]}" --metrics-port-file "$WORK/off.metrics"
OFF="127.0.0.1:$LAST_PORT"
start_serve ngram "${SERVER[@]}" --metrics-port-file "$WORK/ngram.metrics" \
  --speculative-method ngram --num-speculative-tokens "${SPEC_TOKENS:-4}"
NGRAM="127.0.0.1:$LAST_PORT"
record "driver" /usr/bin/python3 scripts/bench/speculative.py --off "$OFF" --on "$NGRAM" ...
/usr/bin/python3 "$ROOT/scripts/bench/speculative.py" --off "$OFF" --on "$NGRAM" \
  --on-metrics "127.0.0.1:$(cat "$WORK/ngram.metrics")" --reps "${BENCH_REPS:-3}" \
  --batches "${SPEC_BATCHES:-1,2,4,8,16}" --max-tokens "${SPEC_MAX_TOKENS:-96}" \
  --work "$WORK" --out "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/speculative.md"
