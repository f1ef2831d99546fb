#!/usr/bin/env bash
# The sanitizer stages of CI (scripts/test.sh runs both), in their own build directories:
#
#   scripts/sanitize.sh asan   clang -O1 with AddressSanitizer + UndefinedBehaviorSanitizer and
#                              libFuzzer coverage (./build-asan): builds `tandem`, the fuzz targets
#                              and every test (not the benchmarks); runs the whole `unit` and
#                              `integration` suites (chaos for TANDEM_CHAOS_SECONDS=20), the e2e
#                              tests that drive the failure paths ($asan_e2e: bad-input corpora,
#                              KV secrets), and each fuzz target for FUZZ_SECONDS (default 10).
#   scripts/sanitize.sh tsan   clang -O1 with ThreadSanitizer (./build-tsan): the engine and
#                              kvtransfer tests (threads: engine loop, transports, event loops).
#
# Scope (CI budget, docs/reliability.md): the SIMD kernel files are not ASan/UBSan-instrumented
# (common/engine/backend/cpu/kernels/CMakeLists.txt); the other e2e tests run only in the main
# suite.
#
# Every sanitizer report, from any process (servers started by the Python tests included), goes
# to <build>/sanitizer-logs/; a stage fails when a test fails or any report was written.
set -euo pipefail
cd "$(dirname "$0")/.."
stage="${1:?usage: scripts/sanitize.sh asan|tsan}"

asan_e2e='^(serve_bad_input_corpus_test|worker_bad_input_test|kv_secret_test)$'
tsan_tests='^(transport_test|sender_core_test|tcp_protocol_test|tcp_auth_test|sender_binding_test|tcp_limits_test|metered_transport_test|faults_test|cuda_ipc_protocol_test|nccl_coalesce_emulated_test|multi_transport_emulated_test|engine_test|engine_disagg_test|engine_faults_test|scheduler_test|thread_pool_test|async_engine_test|compile_service_test|engine_grammar_wait_test|engine_grammar_foreign_test|engine_grammar_bound_test|tier_store_test|disk_tier_test|engine_tiers_test)$'

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
  "${CCACHE_LAUNCHER[@]}" "${UNITY_ARGS[@]}" "-DTANDEM_SANITIZE=$sanitize" "-DCMAKE_CXX_FLAGS_RELEASE=$flags" \
  "-DCMAKE_C_FLAGS_RELEASE=$flags" "${extra[@]}" >/dev/null

logs="$PWD/$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
supp="$PWD/scripts/sanitizers"
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

# The executable targets a ctest selection needs: its tests' names that name a target (a script
# test's name does not).
targets_of() {
  ninja -C "$build" -t targets all | sed -n 's/^\([A-Za-z0-9_]*\): phony$/\1/p' | sort -u \
    >"$build/phony-targets.txt"
  ctest --test-dir "$build" -N "$@" | awk '/Test +#/ {print $3}' | sort -u |
    comm -12 - "$build/phony-targets.txt"
}

status=0
if [ "$stage" = asan ]; then
  # What the stage runs, not the benchmarks and reference tools: the tests' executables, the
  # `tandem` binary the script tests start, and the fuzz targets.
  mapfile -t tests < <(targets_of -L 'unit|integration')
  cmake --build "$build" -j "$(nproc)" --target tandem fuzzers "${tests[@]}"
  TANDEM_CHAOS_SECONDS="${TANDEM_CHAOS_SECONDS:-20}" \
    ctest --test-dir "$build" -L 'unit|integration' --output-on-failure -j "$(nproc)" \
    --timeout 900 || status=1
  ctest --test-dir "$build" -R "$asan_e2e" --output-on-failure -j "$(nproc)" --timeout 900 ||
    status=1
  scripts/fuzz.sh --build-dir "$build" --no-build "${FUZZ_SECONDS:-10}" || status=1
else
  mapfile -t tests < <(targets_of -R "$tsan_tests")
  cmake --build "$build" -j "$(nproc)" --target "${tests[@]}" nccl_emulated_test
  ctest --test-dir "$build" -R "$tsan_tests" --output-on-failure -j "$(nproc)" --timeout 900 ||
    status=1
  # The device transports' shared sender and the nccl receiver, in the cases that keep gRPC out
  # of the process's threads (TSan cannot see inside the system's uninstrumented libgrpc).
  "$build/bin/nccl_emulated_test" --gtest_filter='*DirectControlChannel*:*RacingConnects*' ||
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
