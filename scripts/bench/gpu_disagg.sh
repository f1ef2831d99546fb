#!/usr/bin/env bash
# Section "gpu_disagg": where splitting prefill from decode pays on one GPU (issue 44, item 4).
# `tandem serve --device cuda` as one process (router and engine) against one prefill and one
# decode worker process on the same GPU (KV over cuda-ipc, every prompt prefilled remotely), on
# the random llama-1b in bf16, for each concurrency C (default 16 and 64):
#   wave    one wave of C requests started together, 256-token prompts, 256 new tokens each:
#           aggregate tok/s, TTFT, ITL p50/p99 and the cluster's KV transfer p50 (tandem bench,
#           as gpu_serve.sh);
#   slo     C decode streams (128-token prompts, 256 new tokens, closed loop) while long prompts
#           (2048 tokens, 16 new tokens) arrive at GPU_DISAGG_LONG_RATE per second for
#           GPU_DISAGG_SECONDS: the decode streams' ITL p50/p99/max, the long prompts' TTFT, and
#           goodput under a TTFT <= GPU_DISAGG_TTFT_SLO_MS, ITL p99 <= GPU_DISAGG_ITL_SLO_MS SLO
#           (scripts/bench/slo_client.py).
# With GPU_DISAGG_MPS=1 both servers run under an MPS control daemon of their own (pipe and log
# directories in the work dir, stopped at the end); otherwise (default) without MPS, and the
# section says so. Two GPUs (one worker each) are not covered: tandem serve puts every worker on
# one device.
#   GPU_DISAGG_CONC="16 64" GPU_DISAGG_SECONDS=30 GPU_DISAGG_LONG_RATE=1 BUILD_DIR=build-gpu \
#     GPU_DISAGG_SERVERS="one-process cuda-ipc" scripts/bench/gpu_disagg.sh
# GPU_DISAGG_DEVICE=cpu with GPU_DISAGG_PRESET=tiny (and small GPU_DISAGG_* sizes) checks the
# script's logic without a GPU (the emulation build's tandem: GPU_DISAGG_DEVICE=cuda there).
# Writes $BENCH_RESULTS/gpu_disagg.{md,json}. About 3.5 minutes on an H200 at the defaults.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init gpu_disagg
PYTHON="${PYTHON:-python3}"
CONC=(${GPU_DISAGG_CONC:-16 64})
REPS="${BENCH_REPS:-1}"
DURATION="${GPU_DISAGG_SECONDS:-30}"
LONG_RATE="${GPU_DISAGG_LONG_RATE:-1}"
LONG_PROMPT="${GPU_DISAGG_LONG_PROMPT:-2048}"
WAVE_LEN="${GPU_DISAGG_WAVE_LEN:-256}"
DECODE_PROMPT="${GPU_DISAGG_DECODE_PROMPT:-128}"
DECODE_OUTPUT="${GPU_DISAGG_DECODE_OUTPUT:-256}"
TTFT_SLO="${GPU_DISAGG_TTFT_SLO_MS:-2000}"
ITL_SLO="${GPU_DISAGG_ITL_SLO_MS:-50}"
PRESET="${GPU_DISAGG_PRESET:-llama-1b}"
read -ra SERVERS <<<"${GPU_DISAGG_SERVERS:-one-process cuda-ipc}"
echo "$REPS" >"$WORK/reps.txt"
echo "$PRESET" >"$WORK/preset.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$WORK/gpu.txt" \
  2>/dev/null || echo "none visible (nvidia-smi failed)" >"$WORK/gpu.txt"
printf '{"duration_s": %s, "long_rate": %s, "long_prompt": %s, "wave_len": %s, "decode_prompt": %s, "decode_output": %s, "ttft_slo_ms": %s, "itl_slo_ms": %s}\n' \
  "$DURATION" "$LONG_RATE" "$LONG_PROMPT" "$WAVE_LEN" "$DECODE_PROMPT" "$DECODE_OUTPUT" \
  "$TTFT_SLO" "$ITL_SLO" >"$WORK/params.json"

mps_stop() {
  if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    unset CUDA_MPS_PIPE_DIRECTORY
  fi
}
trap 'mps_stop; bench_cleanup' EXIT
if [ "${GPU_DISAGG_MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d 2>"$WORK/mps.err"; then
    echo "on (an MPS control daemon of this run)" >"$WORK/mps.txt"
  else
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "off: nvidia-cuda-mps-control -d failed ($(head -c 200 "$WORK/mps.err"))" >"$WORK/mps.txt"
  fi
else
  echo "off (GPU_DISAGG_MPS=1 runs both servers under MPS)" >"$WORK/mps.txt"
fi
log "MPS: $(cat "$WORK/mps.txt")"

model="$(ensure_model "$PRESET")"
vocab="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
  "$model/config.json")"
common=(--model "$model" --device "${GPU_DISAGG_DEVICE:-cuda}" --dtype bf16 --num-kv-blocks 4096
        --max-num-seqs 64 --max-num-batched-tokens 2048
        --max-model-len "$(( LONG_PROMPT + WAVE_LEN + DECODE_PROMPT + DECODE_OUTPUT ))")
CLIENT=("$PYTHON" "$ROOT/scripts/bench/slo_client.py")

run_server() {
  local name="$1"
  shift
  local args=(serve "${common[@]}" "$@" --port 0 --port-file "$WORK/$name.port" --http-port 0
              --http-port-file "$WORK/$name.http")
  record "server $name" "$TANDEM" "${args[@]}"
  start_process "$name" "$WORK/$name.http" "$TANDEM" "${args[@]}"
  local url="http://127.0.0.1:$LAST_PORT" pid="$LAST_PID" waited=0
  while [ ! -s "$WORK/$name.port" ] && [ "$waited" -lt 300 ]; do sleep 0.2; waited=$((waited + 1)); done
  local target="127.0.0.1:$(cat "$WORK/$name.port")"
  log "$name: grpc $target, $url (pid $pid)"
  "$TANDEM" bench --target "$target" --num-requests 4 --concurrency 4 --prompt-len "$WAVE_LEN" \
    --output-len 16 --seed 999 --quiet --progress-interval 0 --sample-interval 0
  for rep in $(seq 1 "$REPS"); do
    for c in "${CONC[@]}"; do
      run_bench "$WORK/$name.wave.c$c.$rep.json" --target "$target" --label "$name wave c=$c" \
        --num-requests "$c" --concurrency "$c" --prompt-len "$WAVE_LEN" --output-len "$WAVE_LEN" \
        --seed $((1000 * rep + c)) --sample-interval 0
      local slo=(--decode-streams "$c" --duration "$DURATION" --long-rate "$LONG_RATE"
                 --long-prompt-len "$LONG_PROMPT" --long-output-len 16
                 --decode-prompt-len "$DECODE_PROMPT" --decode-output-len "$DECODE_OUTPUT"
                 --ttft-slo-ms "$TTFT_SLO" --itl-slo-ms "$ITL_SLO" --vocab-size "$vocab")
      record "client" "$PYTHON" scripts/bench/slo_client.py --url URL "${slo[@]}"
      log "$name slo c=$c: $("${CLIENT[@]}" --url "$url" "${slo[@]}" --seed $((2000 * rep + c)) \
        --label "$name slo c=$c" --json-out "$WORK/$name.slo.c$c.$rep.json" | cut -c1-160)"
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
    *) echo "gpu_disagg.sh: unknown server $server (one-process, cuda-ipc)" >&2; exit 2 ;;
  esac
done
mps_stop
render gpu_disagg "$WORK" "$BENCH_RESULTS"
log "wrote $BENCH_RESULTS/gpu_disagg.md"
