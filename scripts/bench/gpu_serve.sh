#!/usr/bin/env bash
# Section "gpu_serve": serving on one GPU through `tandem serve --device cuda`, one process
# (router and engine) against a disaggregated cluster on the same GPU (one prefill and one decode
# worker process, KV over cuda-ipc, every prompt prefilled remotely), on the random llama-1b in
# bf16: for each concurrency C, one wave of C requests started together, 256-token prompts, 256
# new tokens each (ignore_eos), greedy, each wave with its own prompts (no prefix-cache hits),
# after a warm-up. BENCH_REPS rounds (default 3) of the whole sweep per server; medians.
#   GPU_SERVE_CONC="1 16 64" GPU_SERVE_PRESET=llama-1b BUILD_DIR=build-gpu \
#     GPU_SERVE_SERVERS="one-process cuda-ipc" GPU_SERVE_DEVICE=cuda scripts/bench/gpu_serve.sh
# (GPU_SERVE_SERVERS: which of the two servers run; GPU_SERVE_DEVICE: cuda, or with the GPU
# emulation build's tandem and a tiny preset, the script's logic checked without a GPU.)
# Needs a CUDA build and a GPU. Writes $BENCH_RESULTS/gpu_serve.{md,json}. About 2 minutes on
# an H200 (the random model made once).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init gpu_serve
CONC=(${GPU_SERVE_CONC:-1 16 64})
REPS="${BENCH_REPS:-3}"
echo "$REPS" >"$WORK/reps.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$WORK/gpu.txt" ||
  echo "none visible (nvidia-smi failed)" >"$WORK/gpu.txt"
echo "${GPU_SERVE_PRESET:-llama-1b}" >"$WORK/preset.txt"
model="$(ensure_model "${GPU_SERVE_PRESET:-llama-1b}")"
read -ra SERVERS <<<"${GPU_SERVE_SERVERS:-one-process cuda-ipc}"
common=(--model "$model" --device "${GPU_SERVE_DEVICE:-cuda}" --dtype bf16 --num-kv-blocks 4096
        --max-num-seqs 64 --max-num-batched-tokens 2048)

run_server() {
  local name="$1"
  shift
  start_serve "$name" "${common[@]}" "$@"
  local target="127.0.0.1:$LAST_PORT" pid="$LAST_PID"
  "$TANDEM" bench --target "$target" --num-requests 4 --concurrency 4 --prompt-len 256 \
    --output-len 16 --seed 999 --quiet --progress-interval 0 --sample-interval 0
  for rep in $(seq 1 "$REPS"); do
    for c in "${CONC[@]}"; do
      run_bench "$WORK/$name.c$c.$rep.json" --target "$target" --label "$name c=$c" \
        --num-requests "$c" --concurrency "$c" --prompt-len 256 --output-len 256 \
        --seed $((1000 * rep + c)) --sample-interval 0
    done
  done
  stop_process "$pid"
}
for server in "${SERVERS[@]}"; do
  case "$server" in
    one-process) run_server one-process ;;
    cuda-ipc)
      run_server cuda-ipc --prefill-workers 1 --decode-workers 1 --kv-transport cuda-ipc \
        --disagg-min-uncached-tokens 0 ;;
    *) echo "gpu_serve.sh: unknown server $server (one-process, cuda-ipc)" >&2; exit 2 ;;
  esac
done
render gpu_serve "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/gpu_serve.md"
