#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Tandem and runs the test suite (everything but the
# `gpu` label). This is exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
scripts/check_format.sh
ctest --test-dir build -LE gpu --output-on-failure -j "$(nproc)" --timeout 900
