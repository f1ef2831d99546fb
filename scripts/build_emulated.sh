#!/usr/bin/env bash
# Builds the test-only GPU emulation binary into ./build-emu/bin/tandem: the CUDA backend and the
# nccl KV transport compiled against the CPU emulator of CUDA and NCCL (TANDEM_GPU_EMULATION,
# cmake/cuda.cmake), no tests, only the `tandem` target. tests/e2e/gpu_emulated_cluster_test.py
# runs it. Never ship this binary: it says so in `tandem --version` and its startup log.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ccache_args.sh
cmake -S . -B build-emu -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${CCACHE_LAUNCHER[@]}" \
  "${UNITY_ARGS[@]}" \
  -DWITH_CUDA=OFF -DTANDEM_GPU_EMULATION=ON -DTANDEM_BUILD_TESTS=OFF "$@" >/dev/null
cmake --build build-emu -j "$(nproc)" --target tandem
