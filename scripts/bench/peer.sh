#!/usr/bin/env bash
# Section "peer": Tandem beside llama.cpp's server on this machine, with one client for both.
#   scripts/bench/peer.sh LLAMA_CPP_DIR
# LLAMA_CPP_DIR is a llama.cpp source tree built outside this repository (its build in
# LLAMA_CPP_DIR/build) or that build directory itself. It needs the targets llama-server and
# llama-quantize, and the source's gguf-py (llama.cpp's GGUF library). The pinned snapshot:
#   a checkout of the llama.cpp repository (ggerganov/llama.cpp) at commit c392e5094, then
#   cmake -S llama.cpp -B llama.cpp/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_CUDA=OFF -DLLAMA_CURL=OFF && ninja -C llama.cpp/build llama-server llama-quantize
# Needs Debian's python3 with numpy (python3-numpy) for the GGUF export; the client is standard
# library only.
#
# The same weights for both: Tandem's random model (make-model, bf16) is written bit for bit as
# a BF16 GGUF by scripts/bench/peer_gguf.py through llama.cpp's gguf-py, then llama-quantize
# makes f16, q8_0 and q4_0 (made once, cached beside the Tandem model). Pairs (Tandem weights,
# quantized at load : peer file): int8 : q8_0, bf16 : f16, int4 g32 : q4_0 (both one scale per
# 32 weights). Each round runs, per pair, one Tandem server then one llama-server (never both at
# once, each with PEER_THREADS compute threads), each through the same sweep with the same
# prompts: one wave of C requests per concurrency C (C started together; 128-token prompts as
# token ids, 128 new tokens, ignore_eos, greedy), then a prefix-cache case (one warm-up request
# caches a long prefix, then PEER_PREFIX_CONC requests share it, each with its own 128 tokens
# after it). Rounds alternate the servers so background load lands on both; the report takes
# medians over the rounds and the Tandem / peer ratio of each round.
# Environment (defaults): LLAMA_CPP_COMMIT (the snapshot's commit, for the report, when
# LLAMA_CPP_DIR is not a git checkout), BENCH_NOTE (a line for the report), PEER_PRESET
# (llama-1b), PEER_PAIRS ("int8:q8_0 bf16:f16 int4g32:q4_0"), PEER_CONC ("1 4 8 16"),
# BENCH_REPS rounds (3), PEER_THREADS (2), PEER_PROMPT_LEN (128), PEER_OUTPUT_LEN (128),
# PEER_PREFIX_LEN (512; 0 skips the case), PEER_PREFIX_CONC (4), PEER_CHECK (1: first check
# that both greedy-decode the bf16 weights alike; 0 skips it).
# Per instruction-set tier: PEER_TANDEM_SIMD (unset: Tandem's best tier here; e.g. avx2: every
# Tandem server runs with TANDEM_SIMD=avx2) against a llama.cpp built for the same tier (e.g.
# GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF; the report names the tier). PEER_BASE_BUILD (a
# build directory of Tandem before a change: its bin/tandem runs as a third side, "base",
# right after the Tandem server of each pair, for a before / after table).
# PEER_LAYERS (the preset's own layer count: a model with that many layers instead, e.g. a
# Mixtral-8x7B block shape with 1 layer), PEER_MEMBW (0; 1: Tandem's batch-1 bytes per token
# against the memory-bandwidth roofline: in each round, after a Tandem server's waves,
# PEER_ROOF_RUNS (3) single-request decode runs, each between two reads of the same number of
# bytes by `membw` with PEER_THREADS threads, so every run is judged against the bandwidth of
# its own moment on a noisy machine), PEER_SECTION (peer: the report's name).
# scripts/bench/peer_moe.sh runs this with a mixture-of-experts model.
# Writes $BENCH_RESULTS/$PEER_SECTION.{md,json}. The default sweep takes about an hour on two idle cores
# (llama-server's waves at concurrency 16 take a minute or more each). Run it on an idle
# machine: llama.cpp's threads meet at a barrier after every graph operation, so its figures
# fall far more than Tandem's when other jobs take the cores (the report flags a busy machine).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -eq 1 ] || usage
if [ -x "$1/bin/llama-server" ]; then
  PEER_BIN="$(cd "$1/bin" && pwd)"
  PEER_SRC="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2>/dev/null)"
elif [ -x "$1/build/bin/llama-server" ]; then
  PEER_BIN="$(cd "$1/build/bin" && pwd)"
  PEER_SRC="$(cd "$1" && pwd)"
else
  echo "peer.sh: no llama-server under $1/bin or $1/build/bin (build llama.cpp first)" >&2
  usage
fi
[ -x "$PEER_BIN/llama-quantize" ] || {
  echo "peer.sh: $PEER_BIN/llama-quantize not built" >&2; exit 1; }
[ -d "$PEER_SRC/gguf-py/gguf" ] || { echo "peer.sh: no gguf-py in '$PEER_SRC'" >&2; exit 1; }
/usr/bin/python3 -c "import numpy" 2>/dev/null || {
  echo "peer.sh: /usr/bin/python3 needs numpy (apt-get install python3-numpy)" >&2; exit 1; }

SECTION_NAME="${PEER_SECTION:-peer}"
bench_init "$SECTION_NAME"
PRESET="${PEER_PRESET:-llama-1b}"
LAYERS="${PEER_LAYERS:-}"
MEMBW_ON="${PEER_MEMBW:-0}"
ROOF_RUNS="${PEER_ROOF_RUNS:-3}"
MEMBW="$BUILD_DIR/bin/membw"
SIMD="${PEER_TANDEM_SIMD:-}"
BASE_BUILD="${PEER_BASE_BUILD:-}"
if [ -n "$BASE_BUILD" ] && [ ! -x "$BASE_BUILD/bin/tandem" ]; then
  echo "peer.sh: no $BASE_BUILD/bin/tandem (PEER_BASE_BUILD)" >&2; exit 1
fi
if [ -n "$SIMD" ]; then export TANDEM_SIMD="$SIMD"; else unset TANDEM_SIMD; fi
if [ "$MEMBW_ON" = 1 ] && [ ! -x "$MEMBW" ]; then
  echo "peer.sh: build membw first (ninja -C $BUILD_DIR membw)" >&2; exit 1
fi
# The model's name in the cache: the preset, with its layer count when PEER_LAYERS is set.
MODEL_NAME="$PRESET${LAYERS:+-l$LAYERS}"
read -ra PAIRS <<<"${PEER_PAIRS:-int8:q8_0 bf16:f16 int4g32:q4_0}"
read -ra CONC <<<"${PEER_CONC:-1 4 8 16}"
REPS="${BENCH_REPS:-3}"
THREADS="${PEER_THREADS:-2}"
PROMPT_LEN="${PEER_PROMPT_LEN:-128}"
OUTPUT_LEN="${PEER_OUTPUT_LEN:-128}"
PREFIX_LEN="${PEER_PREFIX_LEN:-512}"
PREFIX_CONC="${PEER_PREFIX_CONC:-4}"
MAX_CONC=$PREFIX_CONC
for c in "${CONC[@]}"; do
  if [ "$c" -gt "$MAX_CONC" ]; then MAX_CONC=$c; fi
done
SLOT_CTX=$((PREFIX_LEN + PROMPT_LEN + OUTPUT_LEN + 64))
# An exported snapshot is no git checkout: LLAMA_CPP_COMMIT names it in the report then.
PEER_COMMIT="${LLAMA_CPP_COMMIT:-unknown commit}"
if [ -z "${LLAMA_CPP_COMMIT:-}" ] && [ -e "$PEER_SRC/.git" ]; then
  PEER_COMMIT="$(git -C "$PEER_SRC" rev-parse --short=9 HEAD)"
fi
cat >"$WORK/settings.json" <<EOF
{"reps": $REPS, "threads": $THREADS, "prompt_len": $PROMPT_LEN, "output_len": $OUTPUT_LEN,
 "prefix_len": $PREFIX_LEN, "prefix_conc": $PREFIX_CONC, "preset": "$MODEL_NAME",
 "roof_runs": $ROOF_RUNS, "tandem_simd": "${SIMD:-default}", "base": "${BASE_BUILD:+yes}",
 "pairs": "${PAIRS[*]}", "peer_src": "$PEER_SRC", "peer_commit": "$PEER_COMMIT"}
EOF
printf '%s\n' "${BENCH_NOTE:-}" >"$WORK/note.txt"
# The invocation, with the settings that differ from the defaults, for the report (a wrapper
# such as peer_moe.sh passes its own as PEER_COMMAND_LINE).
if [ -n "${PEER_COMMAND_LINE:-}" ]; then
  echo "$PEER_COMMAND_LINE" >"$WORK/command.txt"
else
  {
    env | grep -E '^(PEER_[A-Z_]+|BENCH_REPS)=' | sort | sed -E "s/=(.*)/='\1'/" | tr '\n' ' '
    echo "scripts/bench/peer.sh LLAMA_CPP_DIR"
  } >"$WORK/command.txt"
fi
CLIENT=(/usr/bin/python3 "$ROOT/scripts/bench/peer_client.py")
CLIENT_NAME=(/usr/bin/python3 scripts/bench/peer_client.py)

# ensure_gguf TYPE -> prints the peer's model file of TYPE (bf16, f16, q8_0, q4_0), made once.
ensure_gguf() {
  local type="$1" dir="$MODEL_CACHE/$MODEL_NAME-gguf"
  local file="$dir/$type.gguf"
  mkdir -p "$dir"
  if [ ! -f "$dir/bf16.gguf" ]; then
    log "exporting $MODEL_NAME to $dir/bf16.gguf"
    record "gguf export" /usr/bin/python3 scripts/bench/peer_gguf.py "$MODEL" "$PEER_SRC" \
      "$dir/bf16.gguf"
    /usr/bin/python3 "$ROOT/scripts/bench/peer_gguf.py" "$MODEL" "$PEER_SRC" \
      "$dir/bf16.gguf.tmp" >&2
    mv "$dir/bf16.gguf.tmp" "$dir/bf16.gguf"
  fi
  if [ ! -f "$file" ]; then
    log "llama-quantize $type"
    record "quantize" llama-quantize "$dir/bf16.gguf" "$file" "${type^^}" "$THREADS"
    "$PEER_BIN/llama-quantize" "$dir/bf16.gguf" "$file.tmp" "${type^^}" "$THREADS" \
      >"$WORK/quantize-$type.log" 2>&1 || { tail -20 "$WORK/quantize-$type.log" >&2; exit 1; }
    mv "$file.tmp" "$file"
  fi
  echo "$file"
}

# tandem_args FORMAT -> `tandem serve` weight flags (bf16, int8, int4gN).
tandem_args() {
  case "$1" in
    bf16) echo "--quantization none" ;;
    int8) echo "--quantization int8" ;;
    int4g*) echo "--quantization int4 --quantization-group-size ${1#int4g}" ;;
    *) echo "peer.sh: unknown Tandem format $1" >&2; exit 1 ;;
  esac
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# sweep SIDE FORMAT URL ROUND: the waves of one server (the same prompts on both sides: the
# seeds depend on the round and the concurrency only).
sweep() {
  local side="$1" fmt="$2" url="$3" rep="$4" c
  "${CLIENT[@]}" --url "$url" --concurrency 2 --prompt-len "$PROMPT_LEN" --output-len 16 \
    --seed 999 >/dev/null
  for c in "${CONC[@]}"; do
    record "client" "${CLIENT_NAME[@]}" --url URL --concurrency "$c" --prompt-len "$PROMPT_LEN" \
      --output-len "$OUTPUT_LEN" --seed $((1000 * rep + c))
    "${CLIENT[@]}" --url "$url" --concurrency "$c" --prompt-len "$PROMPT_LEN" \
      --output-len "$OUTPUT_LEN" --seed $((1000 * rep + c)) --label "$side $fmt c=$c" \
      --json-out "$WORK/$side.$fmt.c$c.$rep.json" >>"$WORK/client.log"
    log "$side $fmt c=$c: $(tail -1 "$WORK/client.log" | cut -c1-200)"
  done
  if [ "$PREFIX_LEN" -gt 0 ]; then
    record "client (prefix)" "${CLIENT_NAME[@]}" --url URL --concurrency "$PREFIX_CONC" \
      --prefix-len "$PREFIX_LEN" --warm-prefix --prompt-len "$PROMPT_LEN" \
      --output-len "$OUTPUT_LEN" --seed $((7000 + rep))
    "${CLIENT[@]}" --url "$url" --concurrency "$PREFIX_CONC" --prefix-len "$PREFIX_LEN" \
      --warm-prefix --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" \
      --seed $((7000 + rep)) --label "$side $fmt prefix" \
      --json-out "$WORK/$side.$fmt.prefix.$rep.json" >>"$WORK/client.log"
    log "$side $fmt prefix: $(tail -1 "$WORK/client.log" | cut -c1-200)"
  fi
}

# start_tandem NAME FORMAT [BINARY]: one `tandem serve` on the model; sets LAST_PID, LAST_PORT
# (HTTP).
start_tandem() {
  local name="$1" fmt="$2" bin="${3:-$TANDEM}" weights
  read -ra weights <<<"$(tandem_args "$fmt")"
  local args=(serve --model "$MODEL" --dtype bf16 "${weights[@]}" --threads "$THREADS"
    --max-num-seqs "$MAX_CONC" --max-num-batched-tokens 256 --kv-cache-memory 2GiB --port 0
    --http-port 0 --http-port-file)
  record "tandem server${SIMD:+ (TANDEM_SIMD=$SIMD)}" "$TANDEM" "${args[@]}" F
  start_process "$name" "$WORK/$name.http" "$bin" "${args[@]}" "$WORK/$name.http"
  grep -m1 -o "cpu kernels: .*" "$WORK/$name.log" >"$WORK/$name.kernels" 2>/dev/null || true
  log "tandem $fmt on http port $LAST_PORT (pid $LAST_PID)"
}

# start_peer NAME TYPE: one llama-server on the TYPE file; sets LAST_PID, LAST_PORT.
start_peer() {
  local name="$1" type="$2" file port
  file="$(ensure_gguf "$type")"
  port="$(free_port)"
  # One slot per concurrent request, each with room for the longest prompt and its output.
  local args=(-m "$file" -t "$THREADS" -tb "$THREADS" -np "$MAX_CONC"
    -c $((MAX_CONC * SLOT_CTX)) --host 127.0.0.1 --port "$port" --no-webui)
  local shown=() arg
  for arg in "${args[@]}"; do [ "$arg" = "$port" ] && shown+=(PORT) || shown+=("$arg"); done
  record "llama.cpp server" llama-server "${shown[@]}"
  "$PEER_BIN/llama-server" "${args[@]}" >"$WORK/$name.log" 2>&1 &
  LAST_PID=$!
  LAST_PORT="$port"
  BENCH_PIDS+=("$LAST_PID")
  local waited=0
  until /usr/bin/python3 -c "import urllib.request as u
u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; do
    if ! kill -0 "$LAST_PID" 2>/dev/null; then
      echo "llama-server exited while starting:" >&2
      tail -30 "$WORK/$name.log" >&2
      exit 1
    fi
    sleep 0.5
    waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { echo "llama-server did not start in 300 s" >&2; exit 1; }
  done
  log "llama-server $type on port $port (pid $LAST_PID)"
}

# This snapshot's llama-server aborts in its exit path after a clean shutdown; the shell's
# "Aborted" job notice is noise.
stop_peer() { { stop_process "$1"; } 2>/dev/null; }

# check_same_weights: the peer's BF16 file and Tandem's bf16 weights are the same model, so
# greedy decoding of one prompt gives the same text on both (a wrong export would not).
check_same_weights() {
  local t p
  start_tandem check.tandem bf16
  "${CLIENT[@]}" --url "http://127.0.0.1:$LAST_PORT" --concurrency 1 --num-requests 3 \
    --prompt-len 16 \
    --output-len 8 --seed 5 --keep-text --json-out "$WORK/check.tandem.json" >/dev/null
  stop_process "$LAST_PID"
  start_peer check.peer bf16
  "${CLIENT[@]}" --url "http://127.0.0.1:$LAST_PORT" --concurrency 1 --num-requests 3 \
    --prompt-len 16 \
    --output-len 8 --seed 5 --keep-text --json-out "$WORK/check.peer.json" >/dev/null
  stop_peer "$LAST_PID"
  local texts='import json, sys; print(json.load(open(sys.argv[1]))["texts"])'
  t="$(/usr/bin/python3 -c "$texts" "$WORK/check.tandem.json")"
  p="$(/usr/bin/python3 -c "$texts" "$WORK/check.peer.json")"
  if [ "$t" = "$p" ]; then
    log "same weights: both greedy-decode $t"
    echo "the same 8 tokens from each of 3 prompts" >"$WORK/check.txt"
  else
    log "WARNING: greedy texts differ on the bf16 weights: tandem $t, llama.cpp $p"
    echo "**the texts differ** (Tandem $t, llama.cpp $p)" >"$WORK/check.txt"
  fi
}

# roofline FORMAT URL ROUND: ROOF_RUNS single-request decode runs on a warm Tandem server,
# interleaved with `membw` reads of the bytes one run reads (its weights per token times its
# tokens, in passes over a 1 GiB buffer): bandwidth, run, bandwidth, run, ..., bandwidth. The
# report judges each run against the mean of the reads just before and after it.
roofline() {
  local fmt="$1" url="$2" rep="$3" side="${4:-roof}" i passes
  passes="$(/usr/bin/python3 -c "import sys; sys.path.insert(0, '$ROOT/scripts/bench')
from render_peer import active_bytes_per_token as b
print(max(1, round(b('$MODEL', '$fmt') * ($OUTPUT_LEN - 1) / 2**30)))")"
  [ "$rep" = 1 ] && record "memory read bandwidth ($fmt, between runs)" "$MEMBW" 1024 "$passes" \
    "$THREADS"
  "$MEMBW" 1024 "$passes" "$THREADS" >"$WORK/$side.$fmt.$rep.0.membw.txt"
  for i in $(seq 1 "$ROOF_RUNS"); do
    "${CLIENT[@]}" --url "$url" --concurrency 1 --prompt-len "$PROMPT_LEN" \
      --output-len "$OUTPUT_LEN" --seed $((5000 + 100 * rep + i)) --label "$side $fmt $i" \
      --json-out "$WORK/$side.$fmt.$rep.$i.json" >>"$WORK/client.log"
    "$MEMBW" 1024 "$passes" "$THREADS" >"$WORK/$side.$fmt.$rep.$i.membw.txt"
  done
  log "$side $fmt roofline runs: membw $(grep -ho 'median [0-9.]* GB/s' \
    "$WORK"/"$side"."$fmt"."$rep".*.membw.txt | tr '\n' ' ')"
}

run_pair() {
  local tfmt="$1" ptype="$2" rep="$3"
  start_tandem "tandem.$tfmt.$rep" "$tfmt"
  sweep tandem "$tfmt" "http://127.0.0.1:$LAST_PORT" "$rep"
  [ "$MEMBW_ON" = 1 ] && roofline "$tfmt" "http://127.0.0.1:$LAST_PORT" "$rep"
  stop_process "$LAST_PID"
  if [ -n "$BASE_BUILD" ]; then
    start_tandem "base.$tfmt.$rep" "$tfmt" "$BASE_BUILD/bin/tandem"
    sweep base "$tfmt" "http://127.0.0.1:$LAST_PORT" "$rep"
    [ "$MEMBW_ON" = 1 ] && roofline "$tfmt" "http://127.0.0.1:$LAST_PORT" "$rep" roofbase
    stop_process "$LAST_PID"
  fi
  start_peer "peer.$ptype.$rep" "$ptype"
  sweep peer "$ptype" "http://127.0.0.1:$LAST_PORT" "$rep"
  stop_peer "$LAST_PID"
}

# ensure_layers_model -> the model directory of PRESET with LAYERS layers (made once, bf16).
ensure_layers_model() {
  local dir="$MODEL_CACHE/$MODEL_NAME-bf16"
  if [ ! -f "$dir/config.json" ]; then
    log "making random $PRESET with $LAYERS layer(s) (bf16) in $dir"
    rm -rf "$dir.tmp"
    "$TANDEM" make-model --preset "$PRESET" --layers "$LAYERS" --dtype bf16 --out "$dir.tmp" >&2
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

if [ -n "$LAYERS" ]; then
  MODEL="$(ensure_layers_model)"
  record "model" tandem make-model --preset "$PRESET" --layers "$LAYERS" --dtype bf16 --out DIR
else
  MODEL="$(ensure_model "$PRESET")"
fi
for pair in "${PAIRS[@]}"; do ensure_gguf "${pair#*:}" >/dev/null; done
[ "${PEER_CHECK:-1}" = 0 ] || check_same_weights
for rep in $(seq 1 "$REPS"); do
  for pair in "${PAIRS[@]}"; do run_pair "${pair%%:*}" "${pair#*:}" "$rep"; done
done
echo "$MODEL" >"$WORK/model_dir.txt"
render "$SECTION_NAME" "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/$SECTION_NAME.md"
