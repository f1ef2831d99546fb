#!/usr/bin/env bash
# Section "KV cache tiers in a cluster": two local clusters (`tandem serve --prefill-workers 1
# --decode-workers 2`) on the bundled stories260k model, every worker with a small pool and KV
# cache tiers (--kv-offload-dir: DIR/<role>-<index> each), identical but for the router's prefix
# affinity (tier-aware, or --no-tier-affinity: pool blocks only). scripts/bench/kv_tiers.py
# --phase cluster sends the same interleaved multi-turn trace to both and reports the share of
# later turns' prompt tokens served from cache. Writes $BENCH_RESULTS/kv_tiers_cluster.{md,json}.
# About a minute.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init kv_tiers_cluster
POOL="${KV_TIERS_POOL_BLOCKS:-48}"
CLUSTER=(--model "$ROOT/models/stories260k" --prefill-workers 1 --decode-workers 2 --threads 1
         --num-kv-blocks "$POOL" --block-size 16)
start_serve tiers "${CLUSTER[@]}" --kv-offload-dir "$WORK/kv-tiers"
TIERS="127.0.0.1:$LAST_PORT"
start_serve pool-only "${CLUSTER[@]}" --kv-offload-dir "$WORK/kv-pool-only" --no-tier-affinity
POOL_ONLY="127.0.0.1:$LAST_PORT"
DRIVER=(/usr/bin/python3 "$ROOT/scripts/bench/kv_tiers.py" --phase cluster --pool-blocks "$POOL"
        --reps "${BENCH_REPS:-3}" --sessions "${KV_TIERS_SESSIONS:-16}" --turns 4
        --system-tokens 64 --user-tokens 32 --answer-tokens 32 --concurrency 4 --vocab 512
        --work "$WORK" --out "$BENCH_RESULTS")
record "driver" "${DRIVER[@]}" --on "$TIERS" --off "$POOL_ONLY"
"${DRIVER[@]}" --on "$TIERS" --off "$POOL_ONLY"
log "wrote $BENCH_RESULTS/kv_tiers_cluster.md"
