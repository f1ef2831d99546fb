#!/usr/bin/env bash
# Installs the structured-output clients's npm packages (package-lock.json) into tests/e2e/structured_output/
# node_modules (gitignored), from the npm registry. Idempotent: skips when already installed.
set -euo pipefail
cd "$(dirname "$0")"
# Three e2e tests call this and ctest runs them in parallel: one installs, the others wait and
# then find it installed (a second `npm ci` would delete node_modules under a running test).
exec 9>.install-lock
flock 9
if [ -f node_modules/.package-lock.json ] && cmp -s package-lock.json .installed-lock 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "install.sh: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json .installed-lock
