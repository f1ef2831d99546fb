#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that lacks Tandem's build dependencies (gRPC, protobuf,
# abseil, prometheus-cpp, protoc): the gpu-labelled test executables, cuda_bench and tandem
# (stripped), the CTest files, the shared libraries they load that are not part of glibc, CUDA's
# driver, cuBLAS or NCCL (those must be on the GPU machine; their sizes rule out carrying them),
# and the Python gRPC stubs. Binaries and libraries get an RPATH to the packed libraries, so
# nothing else on that machine (its python3, say) sees them.
#
#   tests/gpu/pack_prebuilt.sh [build-dir] [archive]
#       (defaults: build-gpu and out/gpu-prebuilt.tar.xz, at the repository root)
#
# There, at the repository root (the same absolute path as here: CTest files hold absolute
# paths, so link it there if it differs):
#   tar xf ARCHIVE && TANDEM_GPU_PREBUILT=1 TANDEM_PY_STUBS=$PWD/<build-dir>/py-stubs \
#     PYTHON=python3 tests/gpu/run.sh <build-dir>
# Needs patchelf (Debian package patchelf) and strip here.
set -euo pipefail
if ! command -v patchelf >/dev/null; then
  echo "pack_prebuilt.sh: needs patchelf (apt-get install patchelf)" >&2
  exit 1
fi

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${1:-build-gpu}
build=${build%/}
archive=${2:-out/gpu-prebuilt.tar.xz}
mkdir -p "$(dirname "$archive")"
archive=$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")
bins=(tandem cuda_bench)
mapfile -t -O 2 bins < <(ctest --test-dir "$build" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p')

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$build/bin" "$stage/$build/prebuilt-lib" "$stage/$build/py-stubs"

# Libraries left to the GPU machine: glibc, the CUDA driver, cuBLAS, NCCL.
glibc='linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil'
system_lib="^($glibc|libcuda|libcublas|libcublasLt|libnccl)\\.so"
for b in "${bins[@]}"; do
  cp "$build/bin/$b" "$stage/$build/bin/"
  strip --strip-unneeded "$stage/$build/bin/$b"
  patchelf --force-rpath --set-rpath '$ORIGIN/../prebuilt-lib' "$stage/$build/bin/$b"
  ldd "$build/bin/$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $system_lib ]] && continue
    [[ -e $stage/$build/prebuilt-lib/$name ]] && continue
    cp -L "$path" "$stage/$build/prebuilt-lib/$name"
    patchelf --force-rpath --set-rpath '$ORIGIN' "$stage/$build/prebuilt-lib/$name"
  done
done

find "$build" -name CTestTestfile.cmake -print0 | while IFS= read -r -d '' f; do
  mkdir -p "$stage/$(dirname "$f")"
  cp "$f" "$stage/$f"
done

mapfile -t proto_files < <(cd protos && ls tandem/v1/*.proto)
(cd protos && protoc --proto_path=. --python_out="$stage/$build/py-stubs" \
  --grpc_out="$stage/$build/py-stubs" --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin \
  "${proto_files[@]}")

tar -C "$stage" -cJf "$archive" "$build"
echo "packed ${#bins[@]} binaries, $(ls "$stage/$build/prebuilt-lib" | wc -l) libraries:" \
  "$archive ($(du -h "$archive" | cut -f1))"
