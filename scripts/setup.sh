#!/usr/bin/env bash
# Installs every Debian 12 package Tandem needs to build, run and test. Idempotent.
# Usage: scripts/setup.sh        (as root, or with sudo available)
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang-format ccache
  # sanitizer and fuzzing stages (scripts/sanitize.sh, scripts/fuzz.sh)
  clang libclang-rt-14-dev llvm
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libboost-dev libonig-dev libre2-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libbenchmark-dev libssl-dev zlib1g-dev openssl
  # test clients and tools
  python3 python3-grpcio python3-protobuf python3-numpy python3-torch curl
  prometheus golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev python3-yaml nodejs $(command -v npm >/dev/null 2>&1 || echo npm)
  json-schema-test-suite
)

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
