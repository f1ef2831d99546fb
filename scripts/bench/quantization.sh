#!/usr/bin/env bash
# Section "weight quantization and KV dtypes": for the random llama-110m and llama-1b
# models (bf16 checkpoints) with bf16 / int8 / int4 weights: batch-1 decode tokens/s with the
# memory read bandwidth measured in the same process before every step (fraction of the roofline
# = the median over steps of bytes read / step time / that bandwidth), prefill tokens/s and
# decode tokens/s at batch 8 / 16 / 32 (quant_bench, CpuBackend directly, no server); and the
# accuracy cost of each weight format and KV dtype on stories260k against its f32 reference
# logits (quant_bench --accuracy).
# Each weight format runs with f32 matmul inputs and with bf16 inputs (bf16 dot products); int8
# and int4 g128 also with int8 inputs (per-token int8, integer dot products).
# The formats run interleaved, repetition by repetition, so background load hits them alike.
# Writes $BENCH_RESULTS/quantization.{md,json}.
#   BENCH_REPS=3 QUANT_MODELS="llama-110m llama-1b" scripts/bench/quantization.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init quantization
REPS="${BENCH_REPS:-3}"
BENCH="$BUILD_DIR/bin/quant_bench"
[ -x "$BENCH" ] || { echo "build quant_bench first: ninja -C $BUILD_DIR quant_bench" >&2; exit 1; }
MODELS=(${QUANT_MODELS:-llama-110m llama-1b})
# Compute threads (0: one per core; QUANT_THREADS=1 for single-core figures).
THREADS="${QUANT_THREADS:-0}"
# weights, int4 group, matmul inputs (f32: exact; bf16: bf16 dot products, the serving default on
# CPUs with AVX512_BF16 for bf16 and int4 weights; int8: the default for int8 weights on CPUs
# with AVX512_VNNI; --matmul-input-dtype auto).
FORMATS=("none 128 f32" "none 128 bf16" "int8 128 f32" "int8 128 bf16" "int8 128 int8"
         "int4 32 bf16" "int4 128 f32" "int4 128 bf16" "int4 128 int8")

record "accuracy (stories260k, teacher-forced on its reference sequence)" \
  "$BENCH" --accuracy --model "$ROOT/models/stories260k"
"$BENCH" --accuracy --model "$ROOT/models/stories260k" >"$WORK/accuracy.json"
for rep in $(seq 1 "$REPS"); do
  for preset in "${MODELS[@]}"; do
    dir="$(ensure_model "$preset")"
    steps=32  # batch-1 decode steps, each paired with a bandwidth pass
    for fmt in "${FORMATS[@]}"; do
      set -- $fmt
      cmd=("$BENCH" --model "$dir" --quantization "$1" --group "$2" --kv bf16 --reps 1 --threads "$THREADS"
           --decode-tokens "$steps" --prefill-tokens 512 --batches 8,16,32 --batch-steps 8
           --matmul-input "$3")
      [ "$rep" = 1 ] && record "$preset $1 g$2 $3 inputs" "${cmd[@]}"
      log "rep $rep/$REPS $preset $1 g$2 $3 inputs (load $(cut -d' ' -f1 /proc/loadavg))"
      base="$WORK/run.$preset.$1.g$2.$3.$rep"
      "${cmd[@]}" >"$base.json" 2>"$base.log"
      echo "$(cut -d' ' -f1-3 /proc/loadavg)" >"$base.load"
    done
  done
done
python3 "$ROOT/scripts/bench/quantization.py" "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/quantization.md"
