#!/usr/bin/env bash
# Section "peer_kernels": engine against engine per instruction-set tier, side by side on one
# machine: Tandem's CPU backend (`quant_bench`, no server) forced to a tier with TANDEM_SIMD,
# before and after a change of MatMul path (PEER_OLD_INPUT: the `--matmul-input` the tier's
# default used to be; on AVX2 f32, what `auto` chose there before the AVX2 integer kernels),
# against llama.cpp built for the same tier (`llama-batched-bench`: e.g. GGML_NATIVE=OFF
# GGML_AVX2=ON GGML_AVX512=OFF for avx2), on the same weights.
#   scripts/bench/peer_kernels.sh LLAMA_CPP_DIR LLAMA_BUILD_DIR
# LLAMA_CPP_DIR: the llama.cpp source tree (its gguf-py); LLAMA_BUILD_DIR: its build for the tier
# (bin/llama-batched-bench, bin/llama-quantize). Figures per (weights, round):
#   batch-1 TPOT ms    Tandem: 1000 / quant_bench's batch-1 decode tok/s (median step);
#                      llama.cpp: T_TG / OUT at B=1
#   TTFT ms, one 128-token prompt    Tandem: 128 / prefill tok/s; llama.cpp: T_PP at B=1
#   aggregate tok/s at C=16   16 x OUT output tokens / (16 prompts' prefill + OUT decode steps at
#                      batch 16): Tandem 16 x TTFT + OUT x 16 / batch-16 decode tok/s (prompts
#                      one after another, as a wave's prefill steps); llama.cpp T at B=16 (its 16
#                      prompts in one batch, then OUT steps)
#   of roofline        Tandem's batch-1 weight bytes per token / step time / the read bandwidth
#                      measured before each step (quant_bench)
# PEER_BASE_BUILD (a build directory of Tandem before a change, with bin/quant_bench): its
# quant_bench runs too, with the same (default) MatMul input as the new one, as the "base" side
# of a before / after of the kernels themselves.
# Rounds interleave (Tandem new, Tandem old, Tandem base, llama.cpp per pair); the report takes
# medians.
# PEER_RUN_PEER=0 skips llama.cpp (Tandem's sides only, e.g. a quick base / new check).
# Environment (defaults): PEER_OUTPUT_LEN (OUT above, 128), PEER_TANDEM_SIMD (avx2),
# PEER_OLD_INPUT (f32; none: no old-input side), PEER_BASE_BUILD (unset), PEER_THREADS (2),
# BENCH_REPS (3), PEER_PAIRS ("int8:q8_0 int4g32:q4_0 bf16:f16"), BUILD_DIR (build),
# TANDEM_MODEL_CACHE (/tmp/tandem-models: llama-1b-bf16, made by `tandem make-model --preset
# llama-1b --dtype bf16`), BENCH_RESULTS (docs/benchmarks). Writes peer_kernels.{md,json}.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="$(cd "$1" && pwd)"
LBIN="$(cd "$2" && pwd)/bin"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
QB="$BUILD_DIR/bin/quant_bench"
BASE_BUILD="${PEER_BASE_BUILD:-}"
BASE_QB="${BASE_BUILD:+$(cd "$BASE_BUILD" && pwd)/bin/quant_bench}"
SIMD="${PEER_TANDEM_SIMD:-avx2}"
OLD_INPUT="${PEER_OLD_INPUT:-f32}"
THREADS="${PEER_THREADS:-2}"
OUTPUT_LEN="${PEER_OUTPUT_LEN:-128}"
REPS="${BENCH_REPS:-3}"
read -ra PAIRS <<<"${PEER_PAIRS:-int8:q8_0 int4g32:q4_0 bf16:f16}"
CACHE="${TANDEM_MODEL_CACHE:-/tmp/tandem-models}"
MODEL="$CACHE/llama-1b-bf16"
OUT="${BENCH_RESULTS:-$ROOT/docs/benchmarks}"
for f in "$QB" ${BASE_QB:+"$BASE_QB"} "$LBIN/llama-batched-bench" "$LBIN/llama-quantize"; do
  [ -x "$f" ] || { echo "peer_kernels.sh: $f not built" >&2; exit 1; }
done
[ -f "$MODEL/config.json" ] || { echo "peer_kernels.sh: no $MODEL" >&2; exit 1; }
# PEER_WORK_DIR: keep every raw result there (default: a temporary directory, removed at exit).
if [ -n "${PEER_WORK_DIR:-}" ]; then
  WORK="$PEER_WORK_DIR"
  mkdir -p "$WORK"
else
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi
log() { echo "peer_kernels: $*" >&2; }

# The same weights for llama.cpp: Tandem's bf16 model as a BF16 GGUF, then llama-quantize.
GG="$CACHE/llama-1b-gguf"
mkdir -p "$GG"
if [ ! -f "$GG/bf16.gguf" ]; then
  /usr/bin/python3 "$ROOT/scripts/bench/peer_gguf.py" "$MODEL" "$SRC" "$GG/bf16.gguf.tmp" >&2
  mv "$GG/bf16.gguf.tmp" "$GG/bf16.gguf"
fi
gguf() {
  local t="$1"
  if [ ! -f "$GG/$t.gguf" ]; then
    "$LBIN/llama-quantize" "$GG/bf16.gguf" "$GG/$t.gguf.tmp" "${t^^}" "$THREADS" >&2
    mv "$GG/$t.gguf.tmp" "$GG/$t.gguf"
  fi
  echo "$GG/$t.gguf"
}

# quant_bench arguments of a Tandem format (int8, int4gN, bf16).
qargs() {
  case "$1" in
    int8) echo "--quantization int8" ;;
    int4g*) echo "--quantization int4 --group ${1#int4g}" ;;
    bf16) echo "--quantization none" ;;
  esac
}
# The new default input of a format on the tier: what `auto` resolves to (AutoMatMulInputDtype).
new_input() {
  case "$1" in
    bf16) echo f32 ;;
    *) echo int8 ;;
  esac
}

tandem_run() {  # FORMAT INPUT ROUND TAG [QUANT_BENCH]
  local fmt="$1" input="$2" rep="$3" tag="$4" qb="${5:-$QB}" args
  read -ra args <<<"$(qargs "$fmt")"
  TANDEM_SIMD="$SIMD" "$qb" --model "$MODEL" "${args[@]}" --kv bf16 --threads "$THREADS" --reps 1 \
    --decode-tokens 24 --prefill-tokens 128 --batches 16 --batch-steps 6 \
    --matmul-input "$input" >"$WORK/$tag.$fmt.$rep.json"
  log "tandem $tag $fmt ($input inputs) round $rep: $(cut -c1-160 "$WORK/$tag.$fmt.$rep.json")"
}

peer_run() {  # TYPE ROUND
  local t="$1" rep="$2" file
  file="$(gguf "$t")"
  "$LBIN/llama-batched-bench" -m "$file" -t "$THREADS" -tb "$THREADS" -c 4608 -b 2048 -ub 512 \
    -npp 128 -ntg "$OUTPUT_LEN" -npl 1,16 >"$WORK/peer.$t.$rep.txt" 2>&1
  log "llama.cpp $t round $rep: $(grep -E '^\|\s+128' "$WORK/peer.$t.$rep.txt" | tr -s ' ' | tr '\n' ' ')"
}

{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_int8)$' | tr '\n' ' ')"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$WORK/machine.txt"
for rep in $(seq 1 "$REPS"); do
  for pair in "${PAIRS[@]}"; do
    tf="${pair%%:*}" pt="${pair#*:}"
    tandem_run "$tf" "$(new_input "$tf")" "$rep" new
    if [ "$OLD_INPUT" != none ] && [ "$(new_input "$tf")" != "$OLD_INPUT" ]; then
      tandem_run "$tf" "$OLD_INPUT" "$rep" old
    fi
    [ -z "$BASE_QB" ] || tandem_run "$tf" "$(new_input "$tf")" "$rep" base "$BASE_QB"
    [ "${PEER_RUN_PEER:-1}" = 0 ] || peer_run "$pt" "$rep"
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$WORK/machine.txt"
grep -m1 -ho 'system_info.*' "$WORK"/peer.*.txt | head -1 >>"$WORK/machine.txt" || true
mkdir -p "$OUT"
/usr/bin/python3 "$ROOT/scripts/bench/render_peer_kernels.py" "$WORK" "$OUT" \
  "$OUTPUT_LEN" "PEER_OUTPUT_LEN=$OUTPUT_LEN PEER_TANDEM_SIMD=$SIMD PEER_OLD_INPUT=$OLD_INPUT \
${BASE_BUILD:+PEER_BASE_BUILD=BASE_BUILD_DIR }PEER_THREADS=$THREADS BENCH_REPS=$REPS PEER_PAIRS='${PAIRS[*]}' scripts/bench/peer_kernels.sh \
LLAMA_CPP_DIR LLAMA_BUILD_DIR"
log "wrote $OUT/peer_kernels.md"
