#!/usr/bin/env bash
# Section "peer_moe": mixture of experts, Tandem beside llama.cpp's server on this machine.
#   scripts/bench/peer_moe.sh LLAMA_CPP_DIR
# scripts/bench/peer.sh (see it for LLAMA_CPP_DIR and the method) on a random Mixtral-8x7B block
# shape with PEER_LAYERS layers (1): 8 experts of 4096 x 14336, top 2, the vocabulary and
# attention of Mixtral-8x7B. llama.cpp gets it as its converter writes Mixtral (the llama
# architecture with stacked expert tensors, scripts/bench/peer_gguf.py). Pairs int8 : q8_0 and
# int4 g32 : q4_0, waves of 1 and 16 requests, BENCH_REPS (2) alternating rounds, and Tandem's
# batch-1 bytes per token against the roofline of the active parameters: PEER_ROOF_RUNS (3)
# single-request runs per round and format, each between two `membw` reads of the bytes it
# reads (see peer.sh). Any peer.sh setting can be overridden the same way. Writes
# $BENCH_RESULTS/peer_moe.{md,json}; about 8 minutes a round on two busy cores (making the
# models once not included).
set -euo pipefail
PEER_COMMAND_LINE="$(
  env | grep -E '^(PEER_[A-Z_]+|BENCH_REPS)=' | sort | sed -E "s/=(.*)/='\1'/" | tr '\n' ' '
  echo "scripts/bench/peer_moe.sh LLAMA_CPP_DIR"
)"
export PEER_COMMAND_LINE PEER_SECTION=peer_moe PEER_MEMBW=1
export PEER_PRESET="${PEER_PRESET:-mixtral-8x7b}"
export PEER_LAYERS="${PEER_LAYERS:-1}"
export PEER_PAIRS="${PEER_PAIRS:-int8:q8_0 int4g32:q4_0}"
export PEER_CONC="${PEER_CONC:-1 16}"
export PEER_PREFIX_LEN="${PEER_PREFIX_LEN:-0}"
export PEER_PROMPT_LEN="${PEER_PROMPT_LEN:-64}"
export PEER_OUTPUT_LEN="${PEER_OUTPUT_LEN:-64}"
export BENCH_REPS="${BENCH_REPS:-2}"
exec "$(dirname "$0")/peer.sh" "$@"
