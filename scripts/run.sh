#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Tandem and runs the main job on the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/bin/tandem generate --prompt "${PROMPT:-Once upon a time}" --max-tokens "${MAX_TOKENS:-128}"
