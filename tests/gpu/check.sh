#!/usr/bin/env bash
# The whole GPU check of the GPU engine in one call of at most 10 minutes on one
# H200, with a prebuilt archive (tests/gpu/pack_prebuilt.sh) unpacked at the repository root:
#   1. tests      ctest -L gpu (kernels, backend, engine and NCCL tests on the GPU), <= 240 s
#   2. cluster    gpu_cluster_check.py: the real GPU serving paths (nccl, cuda-ipc), one verdict
#                 each (untimed: it runs while llama.cpp may still be building), <= 120 s
#   3. bench      cuda_bench: engine step times beside the measured bandwidth and matrix peak,
#                 <= 120 s
#   4. peer       scripts/bench/gpu_peer.sh: llama.cpp's CUDA server beside `tandem serve`, one
#                 client, C = 1 16 64, 256/256, 2 rounds, <= 240 s (skipped, saying so, when the
#                 archive holds neither a llama.cpp build nor its sources). With the sources
#                 (<build>/llama-cpp-src, pack_prebuilt.sh's LLAMA_CPP_SRC) its CUDA build
#                 (llama-server, llama-quantize; sm_90, half the cores, niced) runs in the
#                 background from the start, beside the tests and the cluster verdicts, and is
#                 waited for before the first timed phase (bench, peer, serve), so that it
#                 disturbs no timing.
#   5. serve      scripts/bench/gpu_serve.sh, one process, C = 1 16 64, 256/256, 1 round (ITL),
#                 <= 120 s
#   6. disagg     scripts/bench/gpu_disagg.sh (issue 44): one process against 1P+1D over
#                 cuda-ipc on this GPU, C = 16 64: a 256/256 wave (tok/s, TTFT, ITL p99, KV
#                 transfer p50) and 30 s of decode streams under arriving 2048-token prompts
#                 (ITL p99, goodput under a TTFT/ITL SLO), 1 round, <= 300 s
#   fp8gemm       (not in the default list) issue 45's FP8 GEMM: cuda_bench --only fp8-gemm, fp8
#                 weights quantized at load on the random llama-1b, prefill chunks of 512 and 2048
#                 tokens and a batch-32 decode step, weight-only path against the FP8 tensor-core
#                 GEMM (ms and the speedup), <= 150 s
#
#   tests/gpu/check.sh [PHASE...]        (default: the first six, in that order)
#   issue 45's FP8 GEMM, with its correctness tests first:
#     tests/gpu/check.sh tests fp8gemm
#   issue 44's measurement, with the cuda-ipc serving verdicts first:
#     tests/gpu/check.sh cluster disagg
#
# The one command, from the build machine (after LLAMA_CPP_SRC=DIR tests/gpu/pack_prebuilt.sh
# build-gpu out/gpu-prebuilt.tar.xz in the checkout the device tool sends; docs/benchmarks/gpu.md):
#   run(command="tar xf out/gpu-prebuilt.tar.xz && tests/gpu/check.sh",
#       carry=["out/gpu-prebuilt.tar.xz"], timeout_s=600)
# Every phase runs under its own time limit and a shared deadline (CHECK_DEADLINE_S, 570 s from
# the start): a phase that would not fit in what is left is skipped with a SKIP line, so the
# command always ends with its summary; name the skipped phases to run them in a second call.
# Writes to $OUT when set (the device tool's folder), else build-gpu/check: summary.txt (every
# verdict and figure), tests.log and bench.log, the benchmark sections gpu_serve.md and
# gpu_peer.md, gpu_disagg.md, fp8gemm.log, and logs.tar.xz (every phase's log and raw result).
# Exit 0 when every phase that ran passed.
# Environment: BUILD_DIR (build-gpu), CHECK_DEADLINE_S (570), PYTHON (python3),
# TANDEM_GPU_PREBUILT (1: no configure or build; 0: run.sh builds first, which takes minutes).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
build=${BUILD_DIR:-build-gpu}
build=$(cd "$build" 2>/dev/null && pwd || echo "$root/$build")
out=${OUT:-$build/check}
mkdir -p "$out"
deadline=$(( $(date +%s) + ${CHECK_DEADLINE_S:-570} ))
export PYTHON=${PYTHON:-python3}
export TANDEM_GPU_PREBUILT=${TANDEM_GPU_PREBUILT:-1}
export TANDEM_PY_STUBS=${TANDEM_PY_STUBS:-$build/py-stubs}
# One random llama-1b for every phase (cuda_backend_test writes it, the scripts find it).
export TANDEM_MODEL_CACHE=$build/gpu_test_models
export BUILD_DIR=$build
# CTest files and test binaries hold the absolute paths of the machine that built them
# (pack_prebuilt.sh wrote them down): make them lead here.
if [ -f "$build/prebuilt-paths.txt" ]; then
  while read -r what path; do
    here=$root
    [ "$what" = build ] && here=$build
    if [ "$path" != "$here" ] && [ ! -e "$path" ]; then
      mkdir -p "$(dirname "$path")" && ln -s "$here" "$path"
    fi
  done <"$build/prebuilt-paths.txt"
fi
logs=$(mktemp -d)
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
left() { echo $(( deadline - $(date +%s) )); }

phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(tests cluster bench peer serve disagg)
note "check.sh $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>/dev/null || echo 'no GPU visible'), $(nproc) cores; phases: ${phases[*]}"

# run_phase NAME NEED LIMIT CMD...: runs CMD (log: NAME.log) if NEED seconds are left, for at
# most LIMIT seconds (and never past the deadline).
failed=0
run_phase() {
  local name=$1 need=$2 limit=$3
  shift 3
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt "$need" ]; then
    note "SKIP $name: ${remaining}s left, it needs about ${need}s (run: tests/gpu/check.sh $name)"
    return
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local start rc
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    note "PASS $name (${took}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "FAIL $name: stopped at its ${limit}s limit"
    failed=1
  else
    note "FAIL $name: exit $rc (${took}s)"
    failed=1
  fi
  [ $rc -eq 0 ] || tail -15 "$logs/$name.log" | sed "s/^/  $name| /"
}

# llama.cpp's CUDA server from the packed sources, built here (nvcc, cmake and ninja are on the
# GPU machine) into <build>/llama-cpp, in the background while the tests run.
llama=${LLAMA_CPP_BUILD:-$build/llama-cpp}
llama_src=$build/llama-cpp-src
llama_pid=""
if [[ " ${phases[*]} " == *" peer "* ]] && [ ! -x "$llama/bin/llama-server" ] &&
  [ -f "$llama_src/CMakeLists.txt" ]; then
  (
    set -e
    cmake -S "$llama_src" -B "$llama" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${LLAMA_CPP_CUDA_ARCHS:-90-real}" -DGGML_NATIVE=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
    nice -n 10 ninja -C "$llama" -j "$(( ($(nproc) + 1) / 2 ))" llama-server llama-quantize
    cp "$llama_src/commit.txt" "$llama/commit.txt" 2>/dev/null || true
  ) >"$logs/peer-build.log" 2>&1 &
  llama_pid=$!
  note "peer-build: llama.cpp's CUDA server building in the background (pid $llama_pid)"
fi
# wait_peer_build: before a timed phase, the background build ends (or is stopped at the
# deadline's last 150 s, leaving the peer phase to skip).
wait_peer_build() {
  [ -n "$llama_pid" ] || return 0
  local start
  start=$(date +%s)
  while kill -0 "$llama_pid" 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 2; done
  if kill -0 "$llama_pid" 2>/dev/null; then
    kill -- "$llama_pid" 2>/dev/null
    pkill -P "$llama_pid" 2>/dev/null
    note "FAIL peer-build: not done with $(left)s left (log in logs.tar.xz: peer-build.log)"
    failed=1
  elif wait "$llama_pid"; then
    note "PASS peer-build (waited $(( $(date +%s) - start ))s for it)"
  else
    tail -20 "$logs/peer-build.log"
    note "FAIL peer-build: see peer-build.log"
    failed=1
  fi
  llama_pid=""
}

bench_results=$logs/results
for phase in "${phases[@]}"; do
  case $phase in bench | fp8gemm | peer | serve | disagg) wait_peer_build ;; esac
  case $phase in
    tests)
      # run.sh's own phases, one at a time, so that each gets its own limit here.
      run_phase tests 120 240 env RUN_SH_PHASES=tests tests/gpu/run.sh "$build"
      cp "$logs/tests.log" "$out/tests.log" 2>/dev/null ;;
    bench)
      run_phase bench 60 120 "$build/bin/cuda_bench" --model "$TANDEM_MODEL_CACHE/llama-1b-bf16"
      cp "$logs/bench.log" "$out/bench.log" 2>/dev/null ;;
    fp8gemm)
      run_phase fp8gemm 60 150 "$build/bin/cuda_bench" --model "$TANDEM_MODEL_CACHE/llama-1b-bf16" \
        --only fp8-gemm
      cp "$logs/fp8gemm.log" "$out/fp8gemm.log" 2>/dev/null ;;
    cluster)
      run_phase cluster 60 120 "$PYTHON" tests/gpu/gpu_cluster_check.py "$build" ;;
    serve)
      run_phase serve 60 120 env BENCH_REPS=1 GPU_SERVE_SERVERS=one-process \
        BENCH_RESULTS="$bench_results" scripts/bench/gpu_serve.sh
      cp "$bench_results/gpu_serve.md" "$out/" 2>/dev/null ;;
    disagg)
      run_phase disagg 150 300 env BENCH_REPS=1 BENCH_RESULTS="$bench_results" \
        scripts/bench/gpu_disagg.sh
      cp "$bench_results/gpu_disagg.md" "$out/" 2>/dev/null ;;
    peer)
      if [ ! -x "$llama/bin/llama-server" ]; then
        note "SKIP peer: no llama.cpp CUDA build in $llama (pack its sources: LLAMA_CPP_SRC=DIR tests/gpu/pack_prebuilt.sh)"
        continue
      fi
      run_phase peer 120 240 env BENCH_REPS=2 BENCH_RESULTS="$bench_results" \
        LLAMA_CPP_COMMIT="${LLAMA_CPP_COMMIT:-$(cat "$llama/commit.txt" 2>/dev/null || echo unknown)}" \
        scripts/bench/gpu_peer.sh "$llama"
      cp "$bench_results/gpu_peer.md" "$out/" 2>/dev/null ;;
    *)
      note "unknown phase $phase (tests cluster bench peer serve disagg fp8gemm)"
      failed=1 ;;
  esac
done
wait_peer_build

# The figures, last, so that the device tool's output tail shows them.
{
  echo
  [ -f "$logs/tests.log" ] && sed -n '/GPU summary/,$p' "$logs/tests.log" | grep -v '^$' | head -30
  [ -f "$logs/bench.log" ] && sed -n '/^cuda_bench:/,$p' "$logs/bench.log"
  [ -f "$logs/fp8gemm.log" ] && sed -n '/^cuda_bench fp8-gemm:/,$p' "$logs/fp8gemm.log"
  [ -f "$logs/cluster.log" ] && grep '^VERDICT' "$logs/cluster.log"
  [ -f "$out/gpu_serve.md" ] && grep '^| ' "$out/gpu_serve.md"
  [ -f "$out/gpu_peer.md" ] && grep -E '^(\| |Same-weights)' "$out/gpu_peer.md"
  [ -f "$out/gpu_disagg.md" ] && grep -E '^(\| |C=)' "$out/gpu_disagg.md"
} | tee -a "$summary"
cp -r "$build/gpu-logs" "$logs/run-sh-logs" 2>/dev/null
tar -C "$logs" -cJf "$out/logs.tar.xz" . 2>/dev/null
rm -rf "$logs"
note "check.sh: $([ $failed -eq 0 ] && echo PASSED || echo FAILED); $(left)s of the deadline left; files in $out"
exit $failed
