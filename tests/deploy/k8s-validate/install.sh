#!/usr/bin/env bash
# Installs this folder's npm packages (package-lock.json) into node_modules, once, under a lock.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../../../scripts/npm_ci_locked.sh" "$here"
