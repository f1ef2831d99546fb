#!/usr/bin/env bash
# Configures and builds Tandem into ./build (Release, WITH_CUDA=AUTO unless overridden).
# Usage: scripts/build.sh [--run] [extra cmake args...]
#   --run   only the `tandem` binary (scripts/run.sh); a fresh ./build is configured without the
#           tests (whose libraries `scripts/setup.sh --run` does not install), an existing one
#           keeps its configuration
#   default everything: `tandem`, the tests and benchmarks (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ccache_args.sh
targets=()
tests=(-DTANDEM_BUILD_TESTS=ON)
if [ "${1:-}" = --run ]; then
  shift
  targets=(--target tandem)
  tests=()
  [ -f build/CMakeCache.txt ] || tests=(-DTANDEM_BUILD_TESTS=OFF)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${CCACHE_LAUNCHER[@]}" \
  "${UNITY_ARGS[@]}" "${tests[@]}" "$@" >/dev/null
cmake --build build -j "$(nproc)" "${targets[@]}"
