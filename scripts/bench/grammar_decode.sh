#!/usr/bin/env bash
# Structured-output decode cost on the random llama presets (32k llama2 tokenizer): one engine
# per model, unconstrained and JSON-schema-constrained runs alternating at batch 1 and 16
# (medians), greedy and at temperature 1, then the mask time per token (tests/bench/grammar_bench.cc, --decode).
# Usage: scripts/bench/grammar_decode.sh [preset...]   (default: llama-110m)
# Environment: BENCH_REPS rounds (default 3), GRAMMAR_TOKENS tokens per request (default 32),
# TANDEM_MODEL_CACHE (lib.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init grammar
BENCH="$BUILD_DIR/bin/grammar_bench"
[ -x "$BENCH" ] || { echo "grammar: $BENCH not built (ninja -C $BUILD_DIR grammar_bench)" >&2; exit 1; }
log "machine: $(machine_description)"
for preset in "${@:-llama-110m}"; do
  for t in 0 1; do
    "$BENCH" --decode "$(ensure_model "$preset")" "${BENCH_REPS:-3}" "${GRAMMAR_TOKENS:-32}" "$t"
  done
done
