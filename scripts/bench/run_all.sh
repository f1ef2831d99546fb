#!/usr/bin/env bash
# Regenerates the generated sections of docs/benchmarks.md: runs every section script (each
# writes docs/benchmarks/<section>.{md,json}) and splices the sections into docs/benchmarks.md
# between their BEGIN/END markers, leaving hand-written sections alone.
#   BUILD_DIR=build scripts/bench/run_all.sh            # all sections (about 35 minutes)
#   scripts/bench/run_all.sh batching disagg            # some sections
# Section peer runs llama.cpp's server beside Tandem and needs LLAMA_CPP_DIR (a llama.cpp build,
# see scripts/bench/peer.sh); without it the section is skipped.
# BENCH_NO_BUILD=1 skips building tandem, membw and kvtransfer_bench first.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
export BUILD_DIR
RESULTS="${BENCH_RESULTS:-$ROOT/docs/benchmarks}"
export BENCH_RESULTS="$RESULTS"
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(decode_bandwidth batching disagg speculative quantization serve_curve peer)

if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  ninja -C "$BUILD_DIR" tandem membw kvtransfer_bench quant_bench
fi
fragments=()
for s in "${sections[@]}"; do
  echo "=== $s ===" >&2
  if [ "$s" = peer ]; then
    if [ -z "${LLAMA_CPP_DIR:-}" ]; then
      echo "peer: skipped, no llama.cpp given (LLAMA_CPP_DIR=<llama.cpp build>, see peer.sh)" >&2
      continue
    fi
    "$ROOT/scripts/bench/peer.sh" "$LLAMA_CPP_DIR"
  else
    "$ROOT/scripts/bench/$s.sh"
  fi
  fragments+=("$RESULTS/$s.md")
done
python3 "$ROOT/scripts/bench/render.py" splice "$ROOT/docs/benchmarks.md" "${fragments[@]}"
echo "updated $ROOT/docs/benchmarks.md" >&2
# PNG plots of the quantization and serving figures (issue 7), from docs/benchmarks/*.json.
if ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq python3-matplotlib >/dev/null || true
fi
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$ROOT/scripts/bench/plots.py" "$RESULTS"
else
  echo "plots skipped: apt-get install python3-matplotlib" >&2
fi
