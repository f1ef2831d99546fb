#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Tandem and runs the test suite (everything but the
# `gpu` label), the aarch64 stage (scripts/cross_aarch64.sh: cross-built, under qemu-user;
# TANDEM_AARCH64=0 skips it), then the sanitizer stages: AddressSanitizer +
# UndefinedBehaviorSanitizer with the fuzz targets, and ThreadSanitizer (scripts/sanitize.sh,
# docs/reliability.md; TANDEM_SANITIZERS=0 skips those). This is exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
stage() {
  local start=$SECONDS
  "$@"
  echo "test.sh: '$*' took $((SECONDS - start))s"
}
stage scripts/setup.sh
stage scripts/build.sh
stage scripts/build_emulated.sh  # the GPU emulation binary for tests/e2e/gpu_emulated_cluster_test
stage scripts/check_format.sh
stage scripts/check_deps.py build  # what common/engine and kvtransfer include, they link
stage ctest --test-dir build -LE gpu --output-on-failure -j "$(nproc)" --timeout 900
# aarch64: the CPU engine cross-built, its kernel and bundled-model tests under qemu-user
# (correctness of the NEON tiers, not speed).
if [ "${TANDEM_AARCH64:-1}" = 1 ]; then
  stage scripts/cross_aarch64.sh
fi
if [ "${TANDEM_SANITIZERS:-1}" = 1 ]; then
  stage scripts/sanitize.sh asan
  stage scripts/sanitize.sh tsan
fi
