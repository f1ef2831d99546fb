#!/usr/bin/env bash
# A/B of MatMul inputs on quantized weights: `quant_bench` on random llama-1b with
# --matmul-input bf16 and int8 alternating in one script (REPS rounds, 2 threads), for int8 and
# int4 g128 weights; prints a markdown table of medians (batch-1 decode, batch 8 and 16 decode,
# prefill of 128 tokens, the batch-1 roofline fraction), then the kernel-level side-by-side of
# `matmul_inputs_bench` (cold weights, llama-1b projection shapes).
#   scripts/bench/matmul_inputs_ab.sh [REPS]
set -euo pipefail
REPS="${1:-3}"
source "$(dirname "$0")/lib.sh"
bench_init matmul_inputs_ab
MODEL="$(ensure_model llama-1b)"
for rep in $(seq 1 "$REPS"); do
  for quant in int8 int4; do
    for input in bf16 int8; do
      log "repetition $rep/$REPS: $quant weights, $input inputs"
      "$BUILD_DIR/bin/quant_bench" --model "$MODEL" --quantization "$quant" --group 128 \
        --threads 2 --reps 1 --decode-tokens 32 --prefill-tokens 128 --batches 8,16 \
        --batch-steps 4 --matmul-input "$input" 2>/dev/null | tail -1 \
        >"$WORK/$quant.$input.$rep.json"
    done
  done
done
python3 - "$WORK" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
def med(quant, inp, get):
    return statistics.median(get(json.load(open(p))["median"])
                             for p in glob.glob(f"{work}/{quant}.{inp}.*.json"))
metrics = (("batch-1 decode tok/s", lambda m: m["decode_b1_tok_s"]),
           ("batch-8 decode tok/s", lambda m: m["batch_decode_tok_s"]["8"]),
           ("batch-16 decode tok/s", lambda m: m["batch_decode_tok_s"]["16"]),
           ("prefill tok/s (128)", lambda m: m["prefill_tok_s"]),
           ("batch-1 roofline fraction", lambda m: m["roofline_fraction"]))
print("| weights | metric | bf16 inputs | int8 inputs | int8 / bf16 |")
print("| --- | --- | ---: | ---: | ---: |")
for quant, label in (("int8", "int8"), ("int4", "int4 g128")):
    for name, get in metrics:
        b, i = med(quant, "bf16", get), med(quant, "int8", get)
        print(f"| {label} | {name} | {b:.2f} | {i:.2f} | {i / b:.2f}x |")
PY
echo
log "kernel side by side (matmul_inputs_bench)"
"$BUILD_DIR/bin/matmul_inputs_bench" --threads 2 --reps 9
