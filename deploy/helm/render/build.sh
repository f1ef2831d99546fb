#!/usr/bin/env bash
# Builds helm-render offline from Debian's Go packages (golang-go,
# golang-github-masterminds-sprig-dev, golang-k8s-sigs-yaml-dev) into OUT_DIR/helm-render.
# GOPATH mode: /usr/share/gocode holds the libraries; the /v3 import paths of Sprig and semver
# are mapped onto Debian's unversioned directories with symbolic links.
# Usage: deploy/helm/render/build.sh OUT_DIR
set -euo pipefail
src="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
gopath="$out/gopath"
# The chart tests call this at the same time under `ctest -j`: they build one after the other.
exec 9>"$out/.build-lock"
flock 9
gocode=/usr/share/gocode/src
for dep in github.com/Masterminds/sprig github.com/Masterminds/semver sigs.k8s.io/yaml; do
  [ -d "$gocode/$dep" ] || { echo "build.sh: $gocode/$dep missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
mkdir -p "$gopath/src/github.com/Masterminds/sprig" "$gopath/src/github.com/Masterminds/semver" \
  "$gopath/src/tandem"
ln -sfn "$gocode/github.com/Masterminds/sprig" "$gopath/src/github.com/Masterminds/sprig/v3"
ln -sfn "$gocode/github.com/Masterminds/semver" "$gopath/src/github.com/Masterminds/semver/v3"
rm -rf "$gopath/src/tandem/helm-render"
mkdir -p "$gopath/src/tandem/helm-render"
cp "$src/main.go" "$gopath/src/tandem/helm-render/"
cd "$gopath/src/tandem/helm-render"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$out/gocache" GOENV=off GOFLAGS= \
  GOPROXY=off GOTOOLCHAIN=local \
  go build -o "$out/helm-render" .
echo "$out/helm-render"
