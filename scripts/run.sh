#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Tandem and runs the main job: a local disaggregated
# cluster (router + 1 prefill worker + 1 decode worker, KV shipped over TCP) serving the bundled
# model on 127.0.0.1:${PORT:-50051}. It makes one client call to show it works, then keeps
# serving until Ctrl-C (SIGINT/SIGTERM drain it gracefully).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --run  # the toolchain and the libraries `tandem` links
scripts/build.sh --run  # the `tandem` binary only
PORT="${PORT:-50051}"
port_file="$(mktemp -u /tmp/tandem-run.XXXXXX)"
build/bin/tandem serve --prefill-workers "${PREFILL_WORKERS:-1}" --decode-workers "${DECODE_WORKERS:-1}" \
  --port "$PORT" --port-file "$port_file" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server"' INT TERM
for _ in $(seq 1 600); do
  [ -s "$port_file" ] && break
  kill -0 "$server" 2>/dev/null || { echo "run.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
rm -f "$port_file"
echo
echo "== A client call (any gRPC client works; see README.md):"
echo "   build/bin/tandem client --address 127.0.0.1:$PORT --prompt \"${PROMPT:-Once upon a time}\" --usage"
build/bin/tandem client --address "127.0.0.1:$PORT" --prompt "${PROMPT:-Once upon a time}" \
  --max-tokens "${MAX_TOKENS:-64}" --usage
echo
echo "== Serving on 127.0.0.1:$PORT (Ctrl-C to stop)."
wait "$server"
