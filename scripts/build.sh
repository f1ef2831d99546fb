#!/usr/bin/env bash
# Configures and builds Tandem into ./build (Release, WITH_CUDA=AUTO unless overridden).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ccache_args.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${CCACHE_LAUNCHER[@]}" "$@" \
  >/dev/null
cmake --build build -j "$(nproc)"
