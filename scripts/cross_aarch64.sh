#!/usr/bin/env bash
# The aarch64 stage: cross-builds the CPU engine for aarch64 with Debian's cross toolchain
# (cmake/aarch64-linux-gnu.cmake, TANDEM_ENGINE_ONLY: no gRPC, HTTP or workers) into
# ./build-aarch64 and runs, under qemu-user, the thread pool's tests, the kernel tests at every
# aarch64 tier (qemu's default CPU has them all: neon, neon-dotprod, neon-i8mm) and the CPU
# backend's tests on the bundled models: logits against their independent reference logits,
# batch invariance, and quantized weights (int8 inputs among them). Correctness, not speed (qemu
# emulates; its threads run on an x86 host's stronger memory order, so the pool's orders on a
# weakly ordered CPU rest on thread_pool.h's reasoning and the TSan stage). Only what runs is built:
# the kernels, model and backend libraries (no tokenizer, engine or gRPC).
# Usage: scripts/cross_aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Its own packages (not in scripts/setup.sh: the main job does not need them, and this stage adds
# a foreign architecture to apt, which it alone should do): Debian's cross toolchain, qemu-user and the arm64 libraries the CPU engine links (libonig-dev is not
# multi-arch: the amd64 headers serve).
sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi
cross_packages=(g++-aarch64-linux-gnu qemu-user libc6:arm64 libabsl-dev:arm64 libgtest-dev:arm64
                libgmock-dev:arm64 libonig5:arm64)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
  "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
fi
missing=()
for p in "${cross_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y \
    -qq --no-install-recommends "${missing[@]}"
fi
source scripts/ccache_args.sh
tests=(
  thread_pool_test
  # kernels, every tier
  attention_test elementwise_test int8_inputs_test matmul_test matmul_bf16_tiles_test
  matmul_shared_test quant_matmul_test tuned_path_test
  # the bundled models: reference logits, batch invariance, quantized weights
  cpu_backend_reference_test cpu_backend_batch_invariance_test cpu_backend_quantization_test
  cpu_backend_tiers_test
)
cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTANDEM_ENGINE_ONLY=ON -DWITH_CUDA=OFF \
  "${CCACHE_LAUNCHER[@]}" "${UNITY_ARGS[@]}" >/dev/null
cmake --build build-aarch64 -j "$(nproc)" --target "${tests[@]}"
pattern="^($(IFS='|'; echo "${tests[*]}"))\$"
# The scalar tier's cases are plain C++ that the native stage already runs; under emulation only
# the aarch64 tiers (ten times the instructions otherwise).
export GTEST_FILTER="${GTEST_FILTER:--*/scalar}"
ctest --test-dir build-aarch64 -R "$pattern" --output-on-failure -j "$(nproc)" --timeout 900
