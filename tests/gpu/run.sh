#!/usr/bin/env bash
# One-call GPU check: configures and builds the CUDA backend with every `gpu`-labelled test and
# the GPU benchmark, runs the tests and the benchmark, then the real GPU serving paths
# (gpu_cluster_check.py: nccl startup, a 2-GPU nccl cluster, a one-GPU cuda-ipc cluster) with one
# VERDICT line each, and prints a short summary table last.
# Sized to finish in under 8 minutes on one H200 (build included, 16 cores).
#
#   tests/gpu/run.sh [build-dir]      (default: build-gpu at the repository root)
#
# On a GPU machine without Tandem's build dependencies: build here and pack the binaries with
# tests/gpu/pack_prebuilt.sh, then there unpack the archive at the repository root and run
#   TANDEM_GPU_PREBUILT=1 tests/gpu/run.sh   (skips configure and build; PYTHON names a python3
#                                             with grpcio, TANDEM_PY_STUBS the packed stubs).
#
# RUN_SH_PHASES (default "tests bench cluster") picks what runs after the build: the gpu tests,
# cuda_bench, the serving verdicts (tests/gpu/check.sh runs them one at a time, each with its own
# time limit).
# Exit status: 0 when every gpu test and verdict passed (or skipped for lack of a GPU), 1 otherwise.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
logs=$build/gpu-logs
mkdir -p "$logs"
start=$(date +%s)
stamp() { echo "[run.sh $(( $(date +%s) - start ))s] $*"; }

stamp "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
configure_and_build() {
  stamp "configure $build"
  if ! cmake -S "$root" -B "$build" -G Ninja -DWITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      >"$logs/configure.log" 2>&1; then
    tail -30 "$logs/configure.log"
    echo "FAILED: configure"
    exit 1
  fi
  # Every gpu-labelled test is one executable of the same name (tandem_add_test).
  local tests
  mapfile -t tests < <(ctest --test-dir "$build" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p')
  stamp "build ${#tests[@]} gpu tests + cuda_bench + tandem"
  if ! ninja -C "$build" "${tests[@]}" cuda_bench tandem >"$logs/build.log" 2>&1; then
    grep -E "error|FAILED" "$logs/build.log" | head -40
    echo "FAILED: build"
    exit 1
  fi
}
if [[ ${TANDEM_GPU_PREBUILT:-0} == 1 ]]; then
  stamp "prebuilt $build: no configure, no build"
else
  configure_and_build
fi

phases=" ${RUN_SH_PHASES:-tests bench cluster} "
ctest_rc=0 bench_rc=0 cluster_rc=0
: >"$logs/ctest.summary"
if [[ $phases == *" tests "* ]]; then
  stamp "ctest -L gpu"
  rm -rf "$logs/xml"
  GTEST_OUTPUT="xml:$logs/xml/" ctest --test-dir "$build" -L gpu --output-on-failure --timeout 600 \
    >"$logs/ctest.log" 2>&1
  ctest_rc=$?
  grep -E "^\s*[0-9]+/[0-9]+ Test" "$logs/ctest.log" >"$logs/ctest.summary" || true
  if [[ $ctest_rc -ne 0 ]]; then
    # Failures first, with their output, before the tables.
    sed -n '/Failure\|FAILED\|Expected\|error/p' "$logs/ctest.log" | head -60
  fi
  # What the tests print of their numerics (tolerances met, errors seen).
  grep -hE "worst relative|median one-step|llama-1b bf16 activations" "$logs/ctest.log" || true
fi

if [[ $phases == *" bench "* ]]; then
  stamp "cuda_bench"
  "$build/bin/cuda_bench" >"$logs/bench.log" 2>&1
  bench_rc=$?
fi

# The real GPU serving paths (prefill and decode processes): one VERDICT line each.
if [[ $phases == *" cluster "* ]]; then
  stamp "gpu_cluster_check"
  "${PYTHON:-/usr/bin/python3}" "$root/tests/gpu/gpu_cluster_check.py" "$build" \
    >"$logs/cluster.log" 2>&1
  cluster_rc=$?
fi

# gtest case counts per executable (ctest reports skipped cases as passed).
cases() {
  local xml="$logs/xml/$1.xml"
  [[ -f $xml ]] || { echo "-"; return; }
  grep -o '<testsuite name="[^"]*" tests="[0-9]*" failures="[0-9]*" disabled="[0-9]*" skipped="[0-9]*"' \
    "$xml" | sed -E 's/.*tests="([0-9]+)" failures="([0-9]+)".*skipped="([0-9]+)"/\1 \2 \3/' |
    awk '{t += $1; f += $2; s += $3} END {printf "%d run, %d failed, %d skipped", t - s, f, s}'
}
echo
echo "==================== GPU summary ($(( $(date +%s) - start ))s) ===================="
printf "%-28s %-8s %10s   %s\n" "test" "result" "time" "gtest cases"
sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *([^0-9]*[A-Za-z]+)[^0-9]* ([0-9.]+) sec.*/\1 \2 \3/' \
  "$logs/ctest.summary" | while read -r name result secs; do
  printf "%-28s %-8s %9ss   %s\n" "$name" "$result" "$secs" "$(cases "$name")"
done
if [[ $phases == *" bench "* ]]; then
  echo
  grep -A40 "^cuda_bench" "$logs/bench.log" || tail -5 "$logs/bench.log"
  [[ $bench_rc -eq 0 ]] || echo "cuda_bench FAILED (rc $bench_rc, $logs/bench.log)"
fi
if [[ $phases == *" cluster "* ]]; then
  echo
  grep "^VERDICT" "$logs/cluster.log" || {
    tail -20 "$logs/cluster.log"
    echo "VERDICT cluster check: FAIL (no verdicts)"
  }
fi
echo "ctest: $([[ $ctest_rc -eq 0 ]] && echo PASSED || echo FAILED)   logs: $logs"
[[ $ctest_rc -eq 0 && $bench_rc -eq 0 && $cluster_rc -eq 0 ]]
