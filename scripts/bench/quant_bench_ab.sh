#!/usr/bin/env bash
# A/B: two quant_bench binaries (built before and after a kernel or thread-pool change) side by
# side, alternating, with 2 compute threads on a random model (AB_MODEL, default llama-110m;
# AB_ARGS adds quant_bench flags, e.g. "--quantization int4 --group 128"), on an idle machine and,
# with AB_LOADS="idle busy", also with one busy process competing for a core (what a shared
# machine does to a fork-join pool). AB_BATCH sets the batched decode size (default 16);
# AB_OLD_ARGS / AB_NEW_ARGS add flags to one side only (e.g. the same binary twice with
# AB_OLD_ARGS=--mmap-weights). Prints a markdown table of medians: batch-1 decode, batch-B
# decode, prefill of 256 tokens.
#   scripts/bench/quant_bench_ab.sh OLD_QUANT_BENCH NEW_QUANT_BENCH [REPS]
set -euo pipefail
OLD="${1:?old quant_bench}" NEW="${2:?new quant_bench}" REPS="${3:-3}"
source "$(dirname "$0")/lib.sh"
bench_init quant_bench_ab
MODEL="$(ensure_model "${AB_MODEL:-llama-110m}")"
read -r -a EXTRA <<<"${AB_ARGS:-}"
read -r -a OLD_EXTRA <<<"${AB_OLD_ARGS:-}"
read -r -a NEW_EXTRA <<<"${AB_NEW_ARGS:-}"
BATCH="${AB_BATCH:-16}"
export BATCH
run() {  # run BINARY OUT [FLAGS...]
  local bin="$1" out="$2"
  shift 2
  "$bin" --model "$MODEL" --threads 2 --reps 1 --decode-tokens 32 --prefill-tokens 256 \
    --batches "$BATCH" --batch-steps 4 "${EXTRA[@]}" "$@" 2>/dev/null | tail -1 >"$out"
}
for load in ${AB_LOADS:-idle}; do
  busy_pid=""
  if [ "$load" = busy ]; then
    (while :; do :; done) &
    busy_pid=$!
  fi
  for rep in $(seq 1 "$REPS"); do
    log "$load, repetition $rep/$REPS"
    run "$OLD" "$WORK/$load.old.$rep.json" "${OLD_EXTRA[@]}"
    run "$NEW" "$WORK/$load.new.$rep.json" "${NEW_EXTRA[@]}"
  done
  [ -n "$busy_pid" ] && kill "$busy_pid"
done
python3 - "$WORK" <<'PY'
import glob, json, os, statistics, sys
work = sys.argv[1]
batch = os.environ["BATCH"]
def med(load, which, key):
    vals = []
    for p in glob.glob(f"{work}/{load}.{which}.*.json"):
        m = json.load(open(p))["median"]
        vals.append(m["batch_decode_tok_s"][batch] if key == "batch" else m[key])
    return statistics.median(vals)
print("| machine | metric | old | new | new / old |")
print("| --- | --- | ---: | ---: | ---: |")
for load in sorted({p.split("/")[-1].split(".")[0] for p in glob.glob(f"{work}/*.json")}):
    for key, name in (("decode_b1_tok_s", "batch-1 decode tok/s"),
                      ("batch", f"batch-{batch} decode tok/s"), ("prefill_tok_s", "prefill tok/s (256)")):
        o, n = med(load, "old", key), med(load, "new", key)
        print(f"| {load} | {name} | {o:.1f} | {n:.1f} | {n / o:.2f}x |")
PY
