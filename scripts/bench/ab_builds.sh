#!/usr/bin/env bash
# Side-by-side check that a change leaves performance alone: two builds of `tandem` (for example
# the commit before a restructuring and after it) measured alternately in one run, A, B, A, B...,
# so that the machine's drift lands on both. Per round and build:
#   - batch-1 decode tokens/s of `tandem generate` (the random model in bf16, the
#     decode_bandwidth section's measurement, all cores);
#   - `tandem serve` aggregate output tokens/s and median TTFT of one wave at concurrency 1 and
#     16 (the model in int8, 128-token prompts, 128 new tokens, the serve_curve section's shape).
# Prints each figure's median over the rounds per build and the B/A ratio of the medians.
#   scripts/bench/ab_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR      (each with bin/tandem)
# Environment: AB_PRESET (make-model preset, default llama-110m), BENCH_REPS rounds (default 3),
# TANDEM_MODEL_CACHE (lib.sh). About 10 s a round for llama-110m, a minute for llama-1b.
set -euo pipefail
A_DIR="$(cd "${1:?usage: ab_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR}" && pwd)"
B_DIR="$(cd "${2:?usage: ab_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR}" && pwd)"
BUILD_DIR="$B_DIR"
source "$(dirname "$0")/lib.sh"
bench_init ab_builds
REPS="${BENCH_REPS:-3}"
for d in "$A_DIR" "$B_DIR"; do
  [ -x "$d/bin/tandem" ] || { echo "$d/bin/tandem not built" >&2; exit 1; }
done
preset="${AB_PRESET:-llama-110m}"
model="$(ensure_model "$preset")"
: >"$WORK/results.tsv"

# One round of one build: decode, then a server with its waves. Lines: build, metric, value.
measure() {
  local name="$1" bin="$2/bin/tandem" rep="$3"
  "$bin" generate --model "$model" --dtype bf16 --threads 0 --prompt "Once upon a time" \
    --max-tokens 64 --ignore-eos >/dev/null 2>"$WORK/gen.$name.$rep.log"
  local tps
  tps="$(grep -oE 'decode [0-9.]+ tokens/s' "$WORK/gen.$name.$rep.log" | grep -oE '[0-9.]+' | head -1)"
  printf '%s\tbatch-1 decode tok/s\t%s\n' "$name" "$tps" >>"$WORK/results.tsv"
  start_process "serve.$name" "$WORK/serve.$name.port" "$bin" serve --port 0 \
    --port-file "$WORK/serve.$name.port" --model "$model" --dtype bf16 --quantization int8 \
    --threads 0 --max-num-seqs 32 --max-num-batched-tokens 256 --kv-cache-memory 1GiB
  local target="127.0.0.1:$LAST_PORT" pid="$LAST_PID"
  "$TANDEM" bench --target "$target" --num-requests 2 --concurrency 2 --prompt-len 128 \
    --output-len 16 --seed 999 --quiet --progress-interval 0 --sample-interval 0
  local c
  for c in 1 16; do
    "$TANDEM" bench --target "$target" --num-requests "$c" --concurrency "$c" --prompt-len 128 \
      --output-len 128 --seed $((1000 * rep + c)) --quiet --progress-interval 0 \
      --sample-interval 0 --json-out "$WORK/$name.c$c.$rep.json"
    python3 - "$WORK/$name.c$c.$rep.json" "$name" "$c" >>"$WORK/results.tsv" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\tserve c={sys.argv[3]} output tok/s\t{j['throughput']['output_tokens_per_s']:.2f}")
print(f"{sys.argv[2]}\tserve c={sys.argv[3]} TTFT p50 ms\t{j['ttft_ms']['p50']:.1f}")
EOF
  done
  stop_process "$pid"
}

for rep in $(seq 1 "$REPS"); do
  log "round $rep/$REPS"
  if [ $((rep % 2)) = 1 ]; then
    measure A "$A_DIR" "$rep"
    measure B "$B_DIR" "$rep"
  else
    measure B "$B_DIR" "$rep"
    measure A "$A_DIR" "$rep"
  fi
done

echo "$preset; A = $A_DIR, B = $B_DIR; $REPS rounds; $(machine_description)"
python3 - "$WORK/results.tsv" <<'EOF'
import collections, statistics, sys
values = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    build, metric, value = line.rstrip("\n").split("\t")
    if metric not in order:
        order.append(metric)
    values[(build, metric)].append(float(value))
print(f"| metric | A median | B median | B/A | A runs | B runs |")
print("| --- | ---: | ---: | ---: | --- | --- |")
for m in order:
    a, b = values[("A", m)], values[("B", m)]
    ma, mb = statistics.median(a), statistics.median(b)
    runs = lambda xs: " ".join(f"{x:g}" for x in xs)
    print(f"| {m} | {ma:.2f} | {mb:.2f} | {mb / ma:.3f} | {runs(a)} | {runs(b)} |")
EOF
