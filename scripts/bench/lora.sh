#!/usr/bin/env bash
# Section "multi-LoRA": adapters against the base model side by side in one process (tests/bench/lora_bench):
# decode tok/s of a 16-request batch spread over 8 rank-16 adapters (q/k/v/o/gate/up/down)
# against the base model at the same batch, batch-1 decode with one adapter against the base,
# the time to load one rank-16 adapter and 32 adapters loaded at once; llama-1b shape, int8 and
# bf16 weights (adapters in bf16: --lora-dtype auto). Writes $BENCH_RESULTS/lora.md.
# Environment: LORA_PRESET (llama-1b), BENCH_REPS (3), LORA_TOKENS (16).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init lora
REPS="${BENCH_REPS:-3}"
BENCH="$BUILD_DIR/bin/lora_bench"
[ -x "$BENCH" ] || { echo "build lora_bench first: ninja -C $BUILD_DIR lora_bench" >&2; exit 1; }
PRESET="${LORA_PRESET:-llama-1b}"
MODEL="$(ensure_model "$PRESET")"
{
  echo "## Multi-LoRA decode ($PRESET, $(machine_description))"
  echo
  for fmt in "int8:--quantization int8" "bf16:--dtype bf16"; do
    name="${fmt%%:*}"
    log "$name"
    echo "### $name weights"
    echo
    echo '```'
    # shellcheck disable=SC2086
    "$BENCH" --model "$MODEL" ${fmt#*:} --adapters 8 --rank 16 --batch 16 \
      --tokens "${LORA_TOKENS:-16}" --reps "$REPS" --loaded 32 2>&1 | grep -v ' INFO '
    echo '```'
    echo
  done
} >"$WORK/lora.md"
cp "$WORK/lora.md" "$BENCH_RESULTS/lora.md"
log "wrote $BENCH_RESULTS/lora.md"
