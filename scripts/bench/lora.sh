#!/usr/bin/env bash
# Section "multi-LoRA": adapters against the base model side by side in one process (tests/bench/lora_bench):
# decode tok/s of a 16-request batch spread over 8 rank-16 adapters (q/k/v/o/gate/up/down)
# against the base model at the same batch, batch-1 decode with one adapter against the base,
# the time to load one rank-16 adapter and 32 adapters loaded at once; llama-1b shape, int8 and
# bf16 weights (adapters in bf16: --lora-dtype auto). Writes $BENCH_RESULTS/lora.md.
# Environment: LORA_PRESET (llama-1b), BENCH_REPS (3), LORA_TOKENS (16).
# Side by side with an older build: LORA_BENCH_OLD=/path/to/old/lora_bench adds a section where
# the old and this build's lora_bench run in turn (order alternating) LORA_ROUNDS (3) times on
# the LORA_COMPARE formats (bf16), each run printing its ratios; the section ends with the median
# of each binary's ratios over the rounds. LORA_COMPARE_BATCH (16) and LORA_COMPARE_ADAPTERS (8)
# set its batch (1 and 1: both of a run's ratios are batch-1 ones); LORA_COMPARE_ONLY=1 skips
# the sections above it.
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
  main_formats=("int8:--quantization int8" "bf16:--dtype bf16")
  [ "${LORA_COMPARE_ONLY:-0}" = 1 ] && main_formats=()
  for fmt in "${main_formats[@]}"; do
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
  if [ -n "${LORA_BENCH_OLD:-}" ]; then
    echo "## Old against new build, side by side ($PRESET)"
    echo
    cbatch="${LORA_COMPARE_BATCH:-16}"
    cadapters="${LORA_COMPARE_ADAPTERS:-8}"
    echo "old: $LORA_BENCH_OLD; new: $BENCH; $REPS repetitions per run, ${LORA_ROUNDS:-3} rounds;"
    echo "--batch $cbatch --adapters $cadapters --tokens ${LORA_TOKENS:-16}."
    echo
    for fmt in ${LORA_COMPARE:-bf16}; do
      case "$fmt" in
        bf16) args="--dtype bf16" ;;
        int8) args="--quantization int8" ;;
        *) echo "unknown LORA_COMPARE format $fmt" >&2; exit 1 ;;
      esac
      echo "### $fmt weights"
      echo
      echo '```'
      : >"$WORK/ratios_old.txt"
      : >"$WORK/ratios_new.txt"
      for round in $(seq 1 "${LORA_ROUNDS:-3}"); do
        order="old new"
        [ $((round % 2)) = 0 ] && order="new old"
        for which in $order; do
          bin="$BENCH"
          [ "$which" = old ] && bin="$LORA_BENCH_OLD"
          log "$fmt round $round: $which"
          # shellcheck disable=SC2086
          out="$("$bin" --model "$MODEL" $args --adapters "$cadapters" --rank 16 --batch "$cbatch" \
            --tokens "${LORA_TOKENS:-16}" --reps "$REPS" --loaded 1 2>&1 | grep -v ' INFO ')"
          echo "round $round $which: $(echo "$out" | grep '^ratio batch')"
          echo "$out" | grep '^ratio batch' | sed -E 's/.*: ([0-9.]+); ratio batch 1: ([0-9.]+)/\1 \2/' \
            >>"$WORK/ratios_$which.txt"
        done
      done
      for which in old new; do
        median() { cut -d' ' -f"$1" "$WORK/ratios_$which.txt" | sort -n |
                   awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
        echo "$which: median over $(wc -l <"$WORK/ratios_$which.txt") rounds: ratio batch $cbatch $(median 1), ratio batch 1 $(median 2)"
      done
      echo '```'
      echo
    done
  fi
} >"$WORK/lora.md"
cp "$WORK/lora.md" "$BENCH_RESULTS/lora.md"
log "wrote $BENCH_RESULTS/lora.md"
