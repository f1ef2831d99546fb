#!/usr/bin/env bash
# Section "decode is memory-bound": the machine's memory read bandwidth (membw) and
# batch-1 decode tokens/s of the random llama-110m and llama-1b bf16 models (tandem generate),
# each with one compute thread and with one per core, and the weight bytes per second that
# decode rate streams against the bandwidth measured with as many threads.
# Writes $BENCH_RESULTS/decode_bandwidth.{md,json}. About 4 minutes (+ making the models once).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init decode_bandwidth
REPS="${BENCH_REPS:-3}"
MEMBW="$BUILD_DIR/bin/membw"
[ -x "$MEMBW" ] || { echo "build membw first: ninja -C $BUILD_DIR membw" >&2; exit 1; }
ALL="$(nproc)"
THREADS=(1)
[ "$ALL" -gt 1 ] && THREADS+=("$ALL")

: >"$WORK/models.txt"
echo "llama-110m $(ensure_model llama-110m) 64" >>"$WORK/models.txt"
echo "llama-1b $(ensure_model llama-1b) 32" >>"$WORK/models.txt"

for rep in $(seq 1 "$REPS"); do
  log "repetition $rep/$REPS"
  for t in "${THREADS[@]}"; do
    [ "$rep" = 1 ] && record "memory read bandwidth, $t threads" "$MEMBW" 1024 10 "$t"
    "$MEMBW" 1024 10 "$t" >"$WORK/membw.t$t.$rep.txt"
    while read -r preset dir tokens; do
      cmd=("$TANDEM" generate --model "$dir" --dtype bf16 --threads "$t"
           --prompt "Once upon a time" --max-tokens "$tokens" --ignore-eos)
      [ "$rep" = 1 ] && record "batch-1 decode, $preset, $t threads" "${cmd[@]}"
      "${cmd[@]}" >/dev/null 2>"$WORK/generate.$preset.t$t.$rep.log"
      log "$preset, $t threads: $(grep -o 'decode [0-9.]* tokens/s' "$WORK/generate.$preset.t$t.$rep.log" || echo failed)"
    done <"$WORK/models.txt"
  done
done
render decode_bandwidth "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/decode_bandwidth.md"
