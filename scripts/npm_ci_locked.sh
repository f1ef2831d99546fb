#!/usr/bin/env bash
# Usage: scripts/npm_ci_locked.sh DIR
# Installs DIR/package-lock.json into DIR/node_modules (gitignored) from the npm registry, once.
# Tests that share a client folder call this at the same time under `ctest -j`: one installs, the
# others wait on the lock and then find it installed (a second `npm ci` would delete node_modules
# under a running test, or fail with ENOTEMPTY while the first is still unpacking).
set -euo pipefail
cd "$1"
exec 9>.install-lock
flock 9
if [ -f node_modules/.package-lock.json ] && cmp -s package-lock.json .installed-lock 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm_ci_locked.sh: npm is missing (scripts/setup.sh installs it)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json .installed-lock
