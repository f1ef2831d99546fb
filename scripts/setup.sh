#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem needs. Idempotent.
# Usage: scripts/setup.sh [--run]   (as root, or with sudo available)
#   --run   only what building and running the `tandem` binary needs (scripts/run.sh)
#   default everything: also the tests' libraries, tools and clients (scripts/test.sh)
set -euo pipefail

# Build and run `tandem`: the toolchain and the libraries it links.
run_packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libboost-dev libonig-dev libre2-dev nlohmann-json3-dev libssl-dev zlib1g-dev
)
# Build and run the tests (scripts/test.sh): everything else.
test_packages=(
  # format check, sanitizer and fuzzing stages (scripts/sanitize.sh, scripts/fuzz.sh)
  clang-format clang libclang-rt-14-dev llvm
  # test libraries
  libgtest-dev libgmock-dev libbenchmark-dev
  # test clients and tools
  openssl python3 python3-grpcio python3-protobuf python3-numpy python3-torch curl
  prometheus golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev python3-yaml nodejs $(command -v npm >/dev/null 2>&1 || echo npm)
  json-schema-test-suite
)

packages=("${run_packages[@]}")
case "${1:-}" in
  --run) ;;
  "") packages+=("${test_packages[@]}") ;;
  *) echo "usage: scripts/setup.sh [--run]" >&2; exit 2 ;;
esac

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
"${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
