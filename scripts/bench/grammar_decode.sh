#!/usr/bin/env bash
# Structured-output cost, side by side in one run (docs/benchmarks.md, structured output):
#  1. decode tokens/s per random llama preset (32k llama2 tokenizer), one engine per model,
#     unconstrained and JSON-schema-constrained runs alternating ABBA for BENCH_REPS rounds at
#     batch 1 and 16 (medians, spread, per-round ratio), greedy and at temperature 1, then the
#     mask time per token replaying the constrained outputs (before/after, cold/warm);
#  2. schema compile time over the json-schema-test-suite corpus (median, p99) and the mask time
#     per token of random documents on every bundled tokenizer (before/after, cold/warm).
# Usage: scripts/bench/grammar_decode.sh [preset...]   (default: llama-110m)
# Environment: BENCH_REPS rounds (default 5), GRAMMAR_TOKENS tokens per request (default 32),
# GRAMMAR_TEMPERATURES (default "0 1"), GRAMMAR_MASK_INLINE_US=0 (every uncached
# mask computed off the engine loop while its sequence waits),
# TANDEM_MODEL_CACHE (lib.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init grammar
BENCH="$BUILD_DIR/bin/grammar_bench"
[ -x "$BENCH" ] || { echo "grammar: $BENCH not built (ninja -C $BUILD_DIR grammar_bench)" >&2; exit 1; }
log "machine: $(machine_description)"
for preset in "${@:-llama-110m}"; do
  for t in ${GRAMMAR_TEMPERATURES:-0 1}; do
    "$BENCH" --decode "$(ensure_model "$preset")" "${BENCH_REPS:-5}" "${GRAMMAR_TOKENS:-32}" "$t"
  done
done
"$BENCH" --masks
log "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
