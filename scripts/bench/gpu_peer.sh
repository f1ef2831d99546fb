#!/usr/bin/env bash
# Section "gpu_peer": Tandem beside llama.cpp's server on the same GPU, with one client for both.
#   scripts/bench/gpu_peer.sh LLAMA_CPP_DIR
# LLAMA_CPP_DIR is a CUDA build of llama.cpp made outside this repository (bin/llama-server and
# bin/llama-quantize), or a directory holding such a build in build/, with llama.cpp's gguf-py
# (the GGUF library of the same snapshot) beside bin/ or in the source tree the build names
# (GGUF_PY=DIR overrides). tests/gpu/pack_prebuilt.sh packs one for a GPU machine
# (LLAMA_CPP_BUILD=DIR). The pinned snapshot is the CPU peer's (scripts/bench/peer.sh): commit
# c392e5094 (LLAMA_CPP_COMMIT names it in the report when the build is no git checkout).
#
# The same weights for both: Tandem's random model (make-model, bf16) is written bit for bit as
# a BF16 GGUF by scripts/bench/peer_gguf.py, and llama-quantize makes the f16 file llama.cpp's
# CUDA kernels take best (bf16 -> f16 keeps every value with magnitude 2^-14 or more exactly;
# made once, cached beside the Tandem model). Each round runs one `tandem serve --device cuda`
# (router and engine in one process), then one `llama-server -ngl 99 --flash-attn` (every layer
# on the GPU, one slot per concurrent request, continuous batching), never both at once, each
# through the same sweep: one wave of C requests per concurrency C (started together; prompts of
# GPU_PEER_PROMPT_LEN token ids, GPU_PEER_OUTPUT_LEN new tokens, ignore_eos, greedy), after a
# warm-up. Rounds alternate the servers; the table takes medians over rounds and the Tandem /
# peer ratio of each round. Batch-1 TPOT is the C=1 wave's time per output token after the
# first.
# Environment (defaults): GPU_PEER_CONC ("1 16 64"), GPU_PEER_PROMPT_LEN (256),
# GPU_PEER_OUTPUT_LEN (256), BENCH_REPS (2), GPU_PEER_PRESET (llama-1b), GPU_PEER_CHECK (1: first
# check that both greedy-decode the weights alike, 8 tokens of 3 prompts; 0 skips it),
# GPU_PEER_DRY_RUN (1: Tandem's side only, with --device cuda unless GPU_PEER_DEVICE says
# otherwise: checks this script's logic where there is no llama.cpp build or no GPU),
# TANDEM_ARGS (extra `tandem serve` flags), BENCH_NOTE.
# Writes $BENCH_RESULTS/gpu_peer.{md,json}. About 4 minutes on an H200 with the defaults (the
# model and GGUF files made once: another 2 minutes).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
DRY_RUN="${GPU_PEER_DRY_RUN:-0}"
PEER_BIN="" PEER_SRC=""
if [ "$DRY_RUN" != 1 ]; then
  [ $# -eq 1 ] || usage
  if [ -x "$1/bin/llama-server" ]; then
    PEER_BIN="$(cd "$1/bin" && pwd)"
    PEER_SRC="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2>/dev/null || true)"
    [ -d "$1/gguf-py/gguf" ] && PEER_SRC="$(cd "$1" && pwd)"
  elif [ -x "$1/build/bin/llama-server" ]; then
    PEER_BIN="$(cd "$1/build/bin" && pwd)"
    PEER_SRC="$(cd "$1" && pwd)"
  else
    echo "gpu_peer.sh: no llama-server under $1/bin or $1/build/bin" >&2
    usage
  fi
  [ -n "${GGUF_PY:-}" ] && PEER_SRC="$(cd "$GGUF_PY/.." && pwd)"
  [ -x "$PEER_BIN/llama-quantize" ] || { echo "gpu_peer.sh: $PEER_BIN/llama-quantize missing" >&2; exit 1; }
  [ -d "$PEER_SRC/gguf-py/gguf" ] || { echo "gpu_peer.sh: no gguf-py in '$PEER_SRC'" >&2; exit 1; }
fi
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c "import numpy" 2>/dev/null || {
  echo "gpu_peer.sh: $PYTHON needs numpy (for the GGUF export)" >&2; exit 1; }

bench_init gpu_peer
PRESET="${GPU_PEER_PRESET:-llama-1b}"
read -ra CONC <<<"${GPU_PEER_CONC:-1 16 64}"
REPS="${BENCH_REPS:-2}"
PROMPT_LEN="${GPU_PEER_PROMPT_LEN:-256}"
OUTPUT_LEN="${GPU_PEER_OUTPUT_LEN:-256}"
CHECK="${GPU_PEER_CHECK:-1}"
DEVICE="${GPU_PEER_DEVICE:-cuda}"
read -ra EXTRA <<<"${TANDEM_ARGS:-}"
MAX_CONC=1
for c in "${CONC[@]}"; do [ "$c" -gt "$MAX_CONC" ] && MAX_CONC=$c; done
SLOT_CTX=$((PROMPT_LEN + OUTPUT_LEN + 64))
PEER_COMMIT="${LLAMA_CPP_COMMIT:-unknown commit}"
if [ -z "${LLAMA_CPP_COMMIT:-}" ] && [ -n "$PEER_SRC" ] && [ -e "$PEER_SRC/.git" ]; then
  PEER_COMMIT="$(git -C "$PEER_SRC" rev-parse --short=9 HEAD)"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$WORK/gpu.txt" \
  2>/dev/null || echo "none visible (nvidia-smi failed)" >"$WORK/gpu.txt"
cat >"$WORK/settings.json" <<EOF
{"reps": $REPS, "prompt_len": $PROMPT_LEN, "output_len": $OUTPUT_LEN, "preset": "$PRESET",
 "conc": "${CONC[*]}", "peer_commit": "$PEER_COMMIT", "device": "$DEVICE", "dry_run": $([ "$DRY_RUN" = 1 ] && echo true || echo false)}
EOF
printf '%s\n' "${BENCH_NOTE:-}" >"$WORK/note.txt"
{
  env | grep -E '^(GPU_PEER_[A-Z_]+|BENCH_REPS|TANDEM_ARGS)=' | sort | sed -E "s/=(.*)/='\1'/" |
    tr '\n' ' '
  echo "scripts/bench/gpu_peer.sh LLAMA_CPP_DIR"
} >"$WORK/command.txt"
CLIENT=("$PYTHON" "$ROOT/scripts/bench/peer_client.py")
MODEL="$(ensure_model "$PRESET")"
VOCAB="$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$MODEL/config.json")"

# The peer's f16 file, made once beside the Tandem model.
ensure_gguf() {
  local dir="$MODEL_CACHE/$PRESET-gguf"
  mkdir -p "$dir"
  if [ ! -f "$dir/bf16.gguf" ]; then
    log "exporting $PRESET to $dir/bf16.gguf"
    "$PYTHON" "$ROOT/scripts/bench/peer_gguf.py" "$MODEL" "$PEER_SRC" "$dir/bf16.gguf.tmp" >&2
    mv "$dir/bf16.gguf.tmp" "$dir/bf16.gguf"
  fi
  if [ ! -f "$dir/f16.gguf" ]; then
    log "llama-quantize F16"
    "$PEER_BIN/llama-quantize" "$dir/bf16.gguf" "$dir/f16.gguf.tmp" F16 "$(nproc)" \
      >"$WORK/quantize.log" 2>&1 || { tail -20 "$WORK/quantize.log" >&2; exit 1; }
    mv "$dir/f16.gguf.tmp" "$dir/f16.gguf"
  fi
  echo "$dir/f16.gguf"
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# sweep SIDE URL ROUND: the waves of one server (the same prompts on both sides).
sweep() {
  local side="$1" url="$2" rep="$3" c
  "${CLIENT[@]}" --url "$url" --concurrency 4 --prompt-len "$PROMPT_LEN" --output-len 16 \
    --vocab-size "$VOCAB" --seed 999 >/dev/null
  for c in "${CONC[@]}"; do
    record "client" "$PYTHON" scripts/bench/peer_client.py --url URL --concurrency "$c" \
      --prompt-len "$PROMPT_LEN" --output-len "$OUTPUT_LEN" --vocab-size "$VOCAB" \
      --seed $((1000 * rep + c))
    "${CLIENT[@]}" --url "$url" --concurrency "$c" --prompt-len "$PROMPT_LEN" \
      --output-len "$OUTPUT_LEN" --vocab-size "$VOCAB" --seed $((1000 * rep + c)) \
      --label "$side c=$c" --json-out "$WORK/$side.c$c.$rep.json" >>"$WORK/client.log"
    log "$side c=$c: $(tail -1 "$WORK/client.log" | cut -c1-200)"
  done
}

start_tandem() {
  local args=(serve --model "$MODEL" --device "$DEVICE" --dtype bf16 --max-num-seqs "$MAX_CONC"
    --max-num-batched-tokens 2048 --port 0 --http-port 0 --http-port-file "${EXTRA[@]}")
  record "tandem server" "$TANDEM" "${args[@]}" F
  start_process tandem "$WORK/tandem.http" "$TANDEM" "${args[@]}" "$WORK/tandem.http"
  log "tandem on http port $LAST_PORT (pid $LAST_PID)"
}

start_peer() {
  local file port
  file="$(ensure_gguf)"
  port="$(free_port)"
  local args=(-m "$file" -ngl 99 --flash-attn -np "$MAX_CONC" -c $((MAX_CONC * SLOT_CTX))
    -b 2048 -ub 512 --host 127.0.0.1 --port "$port" --no-webui)
  record "llama.cpp server" llama-server "${args[@]/$port/PORT}"
  "$PEER_BIN/llama-server" "${args[@]}" >"$WORK/peer.log" 2>&1 &
  LAST_PID=$!
  BENCH_PIDS+=("$LAST_PID")
  LAST_PORT=$port
  local waited=0
  until "$PYTHON" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$port/health" 2>/dev/null; do
    kill -0 "$LAST_PID" 2>/dev/null || { tail -30 "$WORK/peer.log" >&2; exit 1; }
    sleep 0.5
    waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { echo "llama-server did not start in 300 s" >&2; exit 1; }
  done
  log "llama-server on port $port (pid $LAST_PID)"
}

# check_greedy URL SIDE: 3 prompts, 8 greedy tokens each, one at a time (the texts compared by
# the renderer: a wrong export gives other text; near ties of a random model may too).
check_greedy() {
  "${CLIENT[@]}" --url "$1" --concurrency 1 --num-requests 3 --prompt-len 16 --output-len 8 \
    --vocab-size "$VOCAB" --seed 5 --keep-text --json-out "$WORK/check.$2.json" >/dev/null
}

# This snapshot's llama-server aborts in its exit path after a clean shutdown; the shell's
# "Aborted" job notice is noise.
stop_peer() { { stop_process "$1"; } 2>/dev/null; }

for rep in $(seq 1 "$REPS"); do
  start_tandem
  [ "$rep" = 1 ] && [ "$CHECK" = 1 ] && check_greedy "http://127.0.0.1:$LAST_PORT" tandem
  sweep tandem "http://127.0.0.1:$LAST_PORT" "$rep"
  stop_process "$LAST_PID"
  if [ "$DRY_RUN" != 1 ]; then
    start_peer
    [ "$rep" = 1 ] && [ "$CHECK" = 1 ] && check_greedy "http://127.0.0.1:$LAST_PORT" peer
    sweep peer "http://127.0.0.1:$LAST_PORT" "$rep"
    stop_peer "$LAST_PID"
  fi
done
echo "$REPS" >"$WORK/reps.txt"
"$PYTHON" "$ROOT/scripts/bench/render.py" gpu_peer "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/gpu_peer.md"
cat "$BENCH_RESULTS/gpu_peer.md" | sed -n '/^| /p'
