# shellcheck shell=bash
# start_cluster of the disaggregated benchmarks (sourced after lib.sh, not run): a prefill
# worker, a decode worker and a router. Reads the caller's ENGINE (engine flags of both
# workers), KV_SECRET (the workers' KV authentication flags: `--kv-secret-file PATH`, or
# `--allow-unauthenticated-kv`) and THREADS (the decode worker's thread flags), read at each call.

# start_cluster NAME PREFILL_PREFIX DECODE_PREFIX [PREFILL_ARGS...]: a prefill worker, a decode
# worker and a router on free ports (PREFIX: e.g. "taskset -c 0" or ""). Sets LAST_PORT to the
# router's port.
start_cluster() {
  local name="$1" pre="$2" dec="$3"
  shift 3
  local args=("${ENGINE[@]}" "${KV_SECRET[@]}" "$@")
  # shellcheck disable=SC2086
  record "$name prefill worker" $pre "$TANDEM" prefill --port 0 --port-file "$WORK/$name-p.port" "${args[@]}"
  # shellcheck disable=SC2086
  start_process "$name-prefill" "$WORK/$name-p.port" $pre "$TANDEM" prefill --port 0 \
    --port-file "$WORK/$name-p.port" "${args[@]}"
  local p="$LAST_PORT"
  local dargs=("${ENGINE[@]}" "${KV_SECRET[@]}" "${THREADS[@]}")
  # shellcheck disable=SC2086
  record "$name decode worker" $dec "$TANDEM" decode --port 0 --port-file "$WORK/$name-d.port" "${dargs[@]}"
  # shellcheck disable=SC2086
  start_process "$name-decode" "$WORK/$name-d.port" $dec "$TANDEM" decode --port 0 \
    --port-file "$WORK/$name-d.port" "${dargs[@]}"
  local d="$LAST_PORT"
  record "$name router" "$TANDEM" router --port 0 --port-file "$WORK/$name-r.port" --model "$MODEL" \
    --prefill-addresses "127.0.0.1:$p" --decode-addresses "127.0.0.1:$d"
  start_process "$name-router" "$WORK/$name-r.port" "$TANDEM" router --port 0 \
    --port-file "$WORK/$name-r.port" --model "$MODEL" --prefill-addresses "127.0.0.1:$p" \
    --decode-addresses "127.0.0.1:$d"
  log "$name: prefill :$p, decode :$d, router :$LAST_PORT"
  CLUSTER_PIDS=("${BENCH_PIDS[@]: -3}")
}
