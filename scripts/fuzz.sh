#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and UBSan, and runs
# each for SECONDS on its committed corpus (new inputs go to <build>/fuzz-corpus, not into the
# tree). Exits 1 on any finding; the reproducer is saved in <build>/fuzz-findings/. Replay one:
#   <build>/bin/<target> <build>/fuzz-findings/<file>
# To keep a fixed finding as a regression test, copy the file into the target's corpus folder as
# regression-<name> (the default build replays every corpus file: tests/fuzz/CMakeLists.txt).
#
# Usage: scripts/fuzz.sh [--build-dir DIR] [--no-build] [SECONDS (default 30)] [TARGET...]
# Environment: FUZZ_JOBS (targets run at once; default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) break ;;
  esac
done
seconds="${1:-30}"
[ $# -gt 0 ] && shift

if [ "$do_build" = 1 ]; then
  source scripts/ccache_args.sh
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DWITH_CUDA=OFF -DTANDEM_FUZZ=ON \
    "${CCACHE_LAUNCHER[@]}" \
    -DTANDEM_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1 -fno-sanitize-recover=all" \
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -g1 -fno-sanitize-recover=all" >/dev/null
  cmake --build "$build" --target fuzzers -j "$(nproc)"
fi

list="$build/fuzzers.txt"
[ -s "$list" ] || { echo "fuzz: no targets in $list (configure with -DTANDEM_FUZZ=ON)"; exit 1; }
mkdir -p "$build/fuzz-findings" "$build/fuzz-logs"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {
  local name="$1" corpus="$2"
  mkdir -p "$build/fuzz-corpus/$name"
  if "$build/bin/$name" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$build/fuzz-findings/$name-" \
      "$build/fuzz-corpus/$name" "$corpus" >"$build/fuzz-logs/$name.log" 2>&1; then
    echo "fuzz: $name: $(grep -E '^stat::number_of_executed_units' "$build/fuzz-logs/$name.log" |
      awk '{print $2}') runs in ${seconds}s, no findings"
  else
    echo "fuzz: $name: FINDING (log $build/fuzz-logs/$name.log)"
    tail -40 "$build/fuzz-logs/$name.log"
    return 1
  fi
}

jobs="${FUZZ_JOBS:-$(nproc)}"
pids=()
failed=0
while read -r name corpus; do
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  run_one "$name" "$corpus" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done <"$list"
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" != 0 ]; then
  echo "fuzz: findings in $build/fuzz-findings:"
  ls -l "$build/fuzz-findings"
  exit 1
fi
