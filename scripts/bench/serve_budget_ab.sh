#!/usr/bin/env bash
# A/B of the scheduler's token budget per step (--max-num-batched-tokens) through `tandem serve`:
# for each budget one server (llama-1b, AB_FORMAT weights, default int4), then waves of 1, 8 and
# 16 requests (128-token prompts, 128 new tokens) as in the serving-curve section. Prints a
# markdown table: TTFT at c=1, mean TTFT at c=8, aggregate tok/s at c=8 and c=16.
#   AB_BUDGETS="2048 512 256" scripts/bench/serve_budget_ab.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init serve_budget_ab
dir="$(ensure_model "${AB_MODEL:-llama-1b}")"
fmt="${AB_FORMAT:-int4}"
echo "| budget | TTFT c=1 (ms) | mean TTFT c=8 (ms) | tok/s c=8 | tok/s c=16 |"
echo "| --- | ---: | ---: | ---: | ---: |"
for budget in ${AB_BUDGETS:-2048 512 256}; do
  start_serve "b$budget" --model "$dir" --dtype bf16 --quantization "$fmt" --threads 0 \
    --max-num-seqs 32 --max-num-batched-tokens "$budget" --kv-cache-memory 2GiB
  target="127.0.0.1:$LAST_PORT" pid="$LAST_PID"
  "$TANDEM" bench --target "$target" --num-requests 2 --concurrency 2 --prompt-len 128 \
    --output-len 16 --seed 999 --quiet --progress-interval 0 --sample-interval 0
  for c in 1 8 16; do
    run_bench "$WORK/b$budget.c$c.json" --target "$target" --num-requests "$c" --concurrency "$c" \
      --prompt-len 128 --output-len 128 --seed $((100 + c)) --sample-interval 0
  done
  stop_process "$pid"
  /usr/bin/python3 - "$WORK" "$budget" <<'PY'
import json, sys
work, budget = sys.argv[1], sys.argv[2]
r = {c: json.load(open(f"{work}/b{budget}.c{c}.json")) for c in (1, 8, 16)}
print(f"| {budget} | {r[1]['ttft_ms']['mean']:.0f} | {r[8]['ttft_ms']['mean']:.0f} | "
      f"{r[8]['throughput']['output_tokens_per_s']:.0f} | "
      f"{r[16]['throughput']['output_tokens_per_s']:.0f} |")
PY
done
