# shellcheck shell=bash
# Shared helpers of the benchmark scripts (sourced, not run). Each section script:
#   source "$(dirname "$0")/lib.sh"; bench_init <section-name>
# then starts servers with start_serve / start_process, measures, and renders its markdown
# section with render.py. Environment:
#   BUILD_DIR           build tree with bin/tandem (default: <repo>/build)
#   TANDEM_MODEL_CACHE  where random models are made once (default: /tmp/tandem-models)
#   BENCH_RESULTS       where <section>.json and <section>.md go (default: docs/benchmarks)
#   BENCH_REPS          repetitions of each measurement (default per script)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
TANDEM="$BUILD_DIR/bin/tandem"
MODEL_CACHE="${TANDEM_MODEL_CACHE:-/tmp/tandem-models}"
BENCH_RESULTS="${BENCH_RESULTS:-$ROOT/docs/benchmarks}"
BENCH_PIDS=()

bench_init() {
  SECTION="$1"
  [ -x "$TANDEM" ] || { echo "$SECTION: $TANDEM not built (ninja -C $BUILD_DIR tandem)" >&2; exit 1; }
  WORK="$(mktemp -d "/tmp/tandem-bench-$SECTION.XXXXXX")"
  mkdir -p "$BENCH_RESULTS" "$MODEL_CACHE"
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  write_meta
  log "work dir $WORK"
}

render() { python3 "$ROOT/scripts/bench/render.py" "$@"; }

log() { echo "[$SECTION $(date +%H:%M:%S)] $*" >&2; }

bench_cleanup() {
  local pid
  for pid in "${BENCH_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${BENCH_PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "${BENCH_KEEP_WORK:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}

# ensure_model PRESET -> prints the model directory (made once, bf16, into the cache).
ensure_model() {
  local preset="$1" dir="$MODEL_CACHE/$1-bf16"
  if [ ! -f "$dir/config.json" ]; then
    log "making random $preset (bf16) in $dir"
    rm -rf "$dir.tmp"
    "$TANDEM" make-model --preset "$preset" --dtype bf16 --out "$dir.tmp" >&2
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

# machine_description -> one line: CPU model, cores, memory.
machine_description() {
  local cpu cores mem flags=""
  cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
  cores="$(nproc)"
  mem="$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  grep -qm1 avx512f /proc/cpuinfo && flags="AVX-512"
  grep -qm1 avx512_bf16 /proc/cpuinfo && flags="$flags (BF16)"
  echo "$cpu, $cores cores, $flags, $mem RAM, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
}

# start_process NAME PORTFILE CMD... : runs CMD in the background (log in $WORK/NAME.log), waits
# for PORTFILE; sets LAST_PID and LAST_PORT.
start_process() {
  local name="$1" port_file="$2"
  shift 2
  rm -f "$port_file"
  "$@" >"$WORK/$name.log" 2>&1 &
  LAST_PID=$!
  BENCH_PIDS+=("$LAST_PID")
  local waited=0
  while [ ! -s "$port_file" ]; do
    if ! kill -0 "$LAST_PID" 2>/dev/null; then
      echo "$name exited while starting:" >&2
      tail -30 "$WORK/$name.log" >&2
      exit 1
    fi
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -gt 1500 ]; then
      echo "$name did not start in 300 s" >&2
      tail -30 "$WORK/$name.log" >&2
      exit 1
    fi
  done
  LAST_PORT="$(cat "$port_file")"
}

# start_serve NAME ARGS... : `tandem serve --port 0` with ARGS; sets LAST_PID, LAST_PORT.
start_serve() {
  local name="$1"
  shift
  record "server $name" "$TANDEM" serve --port 0 --port-file "$WORK/$name.port" "$@"
  start_process "$name" "$WORK/$name.port" "$TANDEM" serve --port 0 --port-file "$WORK/$name.port" "$@"
  log "$name serving on port $LAST_PORT (pid $LAST_PID)"
}

# stop_process PID: SIGTERM, then SIGKILL after 60 s.
stop_process() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# run_bench JSON_OUT ARGS... : `tandem bench` against ARGS' --target, table into the log.
run_bench() {
  local out="$1"
  shift
  log "bench $* -> $(basename "$out")"
  record "bench" "$TANDEM" bench --json-out "$out" "$@"
  "$TANDEM" bench --json-out "$out" --progress-interval 10 "$@" >>"$WORK/bench-tables.log"
}

# record LABEL CMD... : appends the command line to $WORK/commands.txt (rendered in the doc).
record() {
  local label="$1"
  shift
  printf '%s\t%s\n' "$label" "$*" >>"$WORK/commands.txt"
}

# write_meta: machine description and the tandem path, for render.py.
write_meta() {
  machine_description >"$WORK/machine.txt"
  echo "$TANDEM" >"$WORK/tandem.txt"
  : >"$WORK/commands.txt"
}
