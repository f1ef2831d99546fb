#!/usr/bin/env bash
# Reruns benchmark sections: each section script writes docs/benchmarks/<section>.{md,json}
# (the full section: every figure, its spread and the commands it ran), then the PNG plots are
# redrawn. docs/benchmarks.md, the summary report, is written by hand: update its table for a
# section from the new <section>.md.
#   BUILD_DIR=build scripts/bench/run_all.sh            # all sections (about 35 minutes)
#   scripts/bench/run_all.sh batching disagg            # some sections
# Sections peer and peer_moe run llama.cpp's server beside Tandem and need LLAMA_CPP_DIR (a
# llama.cpp build, see scripts/bench/peer.sh); without it they are skipped. Section gpu_serve
# needs a CUDA build and a GPU: it runs only when named.
# BENCH_NO_BUILD=1 skips building tandem, membw, kvtransfer_bench and quant_bench first.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
export BUILD_DIR
RESULTS="${BENCH_RESULTS:-$ROOT/docs/benchmarks}"
export BENCH_RESULTS="$RESULTS"
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(decode_bandwidth batching disagg speculative quantization serve_curve peer peer_moe)

if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  ninja -C "$BUILD_DIR" tandem membw kvtransfer_bench quant_bench
fi
for s in "${sections[@]}"; do
  echo "=== $s ===" >&2
  if [ "$s" = peer ] || [ "$s" = peer_moe ]; then
    if [ -z "${LLAMA_CPP_DIR:-}" ]; then
      echo "$s: skipped, no llama.cpp given (LLAMA_CPP_DIR=<llama.cpp build>, see peer.sh)" >&2
      continue
    fi
    "$ROOT/scripts/bench/$s.sh" "$LLAMA_CPP_DIR"
  else
    "$ROOT/scripts/bench/$s.sh"
  fi
done
for s in "${sections[@]}"; do echo "wrote $RESULTS/$s.md" >&2; done
# PNG plots of the quantization and serving figures, from docs/benchmarks/*.json.
if ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq python3-matplotlib >/dev/null || true
fi
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$ROOT/scripts/bench/plots.py" "$RESULTS"
else
  echo "plots skipped: apt-get install python3-matplotlib" >&2
fi
