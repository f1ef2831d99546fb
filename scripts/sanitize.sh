#!/usr/bin/env bash
# The sanitizer stages of CI (scripts/test.sh runs both), in their own build directories:
#
#   scripts/sanitize.sh asan   clang -O1 with AddressSanitizer + UndefinedBehaviorSanitizer and
#                              libFuzzer coverage (./build-asan): builds `tandem`, the fuzz targets
#                              and the unit tests of the code that takes untrusted input or keeps
#                              the books ($asan_unit below: tokenizer, config and safetensors
#                              parsing, KV pool, scheduler, engine, sampler, kvtransfer, router);
#                              runs them, the e2e / integration tests that drive the failure paths
#                              (bad-input corpora, chaos for TANDEM_CHAOS_SECONDS=20),
#                              and each fuzz target for FUZZ_SECONDS (default 10).
#   scripts/sanitize.sh tsan   clang -O1 with ThreadSanitizer (./build-tsan): the engine and
#                              kvtransfer tests (threads: engine loop, transports, event loops).
#
# Scope (CI budget, docs/reliability.md): the SIMD kernel files are not ASan/UBSan-instrumented
# (common/engine/backend/cpu/kernels/CMakeLists.txt), and the kernel / CPU backend / speculative
# decoding / metrics / bench unit tests run only in the main suite.
#
# Every sanitizer report, from any process (servers started by the Python tests included), goes
# to <build>/sanitizer-logs/; a stage fails when a test fails or any report was written.
set -euo pipefail
cd "$(dirname "$0")/.."
stage="${1:?usage: scripts/sanitize.sh asan|tsan}"

asan_unit='^(half_test|thread_pool_test|model_config_test|pre_tokenizer_test|tokenizer_test|unicode_test|safetensors_test|model_loader_test|sampler_test|block_pool_test|engine_test|scheduler_test|engine_disagg_test|engine_faults_test|async_engine_test|crc32c_test|faults_test|layout_test|transport_test|metered_transport_test|tcp_protocol_test|tcp_auth_test|routing_policy_test|request_flow_test|byte_buffer_test)$'
asan_integration='^(chaos_test|serve_bad_input_corpus_test|worker_bad_input_test|kv_secret_test)$'
tsan_tests='^(transport_test|tcp_protocol_test|tcp_auth_test|metered_transport_test|faults_test|engine_test|engine_disagg_test|engine_faults_test|scheduler_test|thread_pool_test|async_engine_test)$'

case "$stage" in
  asan)
    build=build-asan
    sanitize=address,undefined
    extra=(-DTANDEM_FUZZ=ON)
    ;;
  tsan)
    build=build-tsan
    sanitize=thread
    extra=()
    ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac

flags="-O1 -g1 -fno-sanitize-recover=all"
source scripts/ccache_args.sh
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DWITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
  "${CCACHE_LAUNCHER[@]}" "-DTANDEM_SANITIZE=$sanitize" "-DCMAKE_CXX_FLAGS_RELEASE=$flags" \
  "-DCMAKE_C_FLAGS_RELEASE=$flags" "${extra[@]}" >/dev/null

logs="$PWD/$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
supp="$PWD/scripts/sanitizers"
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

# The test names (= executable targets) a ctest selection needs.
targets_of() {
  ctest --test-dir "$build" -N "$@" | awk '/Test +#/ {print $3}'
}

status=0
if [ "$stage" = asan ]; then
  mapfile -t unit < <(targets_of -R "$asan_unit")
  cmake --build "$build" -j "$(nproc)" --target tandem fuzzers "${unit[@]}"
  ctest --test-dir "$build" -R "$asan_unit" --output-on-failure -j "$(nproc)" --timeout 900 ||
    status=1
  TANDEM_CHAOS_SECONDS="${TANDEM_CHAOS_SECONDS:-20}" \
    ctest --test-dir "$build" -R "$asan_integration" --output-on-failure -j "$(nproc)" \
    --timeout 900 || status=1
  scripts/fuzz.sh --build-dir "$build" --no-build "${FUZZ_SECONDS:-10}" || status=1
else
  mapfile -t tests < <(targets_of -R "$tsan_tests")
  cmake --build "$build" -j "$(nproc)" --target "${tests[@]}"
  ctest --test-dir "$build" -R "$tsan_tests" --output-on-failure -j "$(nproc)" --timeout 900 ||
    status=1
fi

if compgen -G "$logs/*" >/dev/null; then
  echo "sanitize $stage: reports in $logs:"
  for f in "$logs"/*; do
    echo "== $f"
    head -60 "$f"
  done
  status=1
fi
[ "$status" = 0 ] && echo "sanitize $stage: clean"
exit "$status"
