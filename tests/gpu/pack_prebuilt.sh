#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that lacks Tandem's build dependencies (gRPC, protobuf,
# abseil, prometheus-cpp, protoc): the gpu-labelled test executables, cuda_bench and tandem
# (stripped), the CTest files, the shared libraries they load that are not part of glibc, CUDA's
# driver, cuBLAS or NCCL (those must be on the GPU machine; their sizes rule out carrying them),
# and the Python gRPC stubs. Binaries and libraries get an RPATH to the packed libraries, so
# nothing else on that machine (its python3, say) sees them.
#
#   [LLAMA_CPP_SRC=DIR | LLAMA_CPP_BUILD=DIR] tests/gpu/pack_prebuilt.sh [build-dir] [archive]
#       (defaults: build-gpu and out/gpu-prebuilt.tar.xz, at the repository root)
#
# With LLAMA_CPP_SRC (a source tree of llama.cpp's pinned snapshot, c392e5094, outside this
# repository: a checkout or an export, e.g. `git -C LLAMA_GIT archive c392e5094 -- .
# ':(exclude)models' ':(exclude)media' ':(exclude)docs' | tar -C DIR -x`) its sources (about 4 MB
# compressed) go to <build-dir>/llama-cpp-src; tests/gpu/check.sh builds its CUDA server there
# (nvcc, cmake and ninja are on the GPU machine) while the gpu tests run.
# With LLAMA_CPP_BUILD (a CUDA build of llama.cpp made outside this repository, bin/llama-server
# and bin/llama-quantize) its two programs, the libraries they load (CUDA's driver, cuBLAS and
# glibc left out as above) and the GGUF library of its source tree (gguf-py, from the build's
# CMakeCache) go to <build-dir>/llama-cpp, where tests/gpu/check.sh's peer phase looks.
#
# There, at the repository root:
#   tar xf ARCHIVE && tests/gpu/check.sh        (everything, see check.sh), or
#   tar xf ARCHIVE && TANDEM_GPU_PREBUILT=1 TANDEM_PY_STUBS=$PWD/<build-dir>/py-stubs \
#     PYTHON=python3 tests/gpu/run.sh <build-dir>
# CTest files and the tests hold this machine's absolute paths of the repository and the build:
# <build-dir>/prebuilt-paths.txt names them and check.sh links them there when they differ.
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

printf 'root %s\nbuild %s\n' "$root" "$root/$build" >"$stage/$build/prebuilt-paths.txt"

if [[ -n ${LLAMA_CPP_SRC:-} ]]; then
  src=$(cd "$LLAMA_CPP_SRC" && pwd)
  for f in CMakeLists.txt ggml/src/ggml-cuda/ggml-cuda.cu examples/server/server.cpp \
      gguf-py/gguf/__init__.py; do
    [[ -f $src/$f ]] || { echo "pack_prebuilt.sh: $src is no llama.cpp tree (no $f)" >&2; exit 1; }
  done
  mkdir -p "$stage/$build/llama-cpp-src"
  (cd "$src" && tar -cf - --exclude=.git --exclude='./build*' --exclude=./models --exclude=./media \
    --exclude=./docs --exclude='__pycache__' .) | tar -C "$stage/$build/llama-cpp-src" -xf -
  if [[ -e $src/.git ]]; then
    git -C "$src" rev-parse --short=9 HEAD >"$stage/$build/llama-cpp-src/commit.txt"
  else
    echo "${LLAMA_CPP_COMMIT:-c392e5094}" >"$stage/$build/llama-cpp-src/commit.txt"
  fi
fi

if [[ -n ${LLAMA_CPP_BUILD:-} ]]; then
  llama=$(cd "$LLAMA_CPP_BUILD" && pwd)
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$llama/CMakeCache.txt" 2>/dev/null || true)
  for f in llama-server llama-quantize; do
    [[ -x $llama/bin/$f ]] || { echo "pack_prebuilt.sh: no $llama/bin/$f" >&2; exit 1; }
  done
  [[ -d $src/gguf-py/gguf ]] || { echo "pack_prebuilt.sh: no gguf-py in '$src'" >&2; exit 1; }
  mkdir -p "$stage/$build/llama-cpp/bin"
  for f in llama-server llama-quantize; do
    cp "$llama/bin/$f" "$stage/$build/llama-cpp/bin/"
    strip --strip-unneeded "$stage/$build/llama-cpp/bin/$f"
    patchelf --force-rpath --set-rpath '$ORIGIN' "$stage/$build/llama-cpp/bin/$f"
    ldd "$llama/bin/$f" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      [[ $name =~ $system_lib ]] && continue
      [[ -e $stage/$build/llama-cpp/bin/$name ]] && continue
      cp -L "$path" "$stage/$build/llama-cpp/bin/$name"
      strip --strip-unneeded "$stage/$build/llama-cpp/bin/$name" 2>/dev/null || true
      patchelf --force-rpath --set-rpath '$ORIGIN' "$stage/$build/llama-cpp/bin/$name"
    done
  done
  (cd "$src" && tar -cf - --exclude='__pycache__' gguf-py) | tar -C "$stage/$build/llama-cpp" -xf -
  git -C "$src" rev-parse --short=9 HEAD >"$stage/$build/llama-cpp/commit.txt" 2>/dev/null ||
    echo "${LLAMA_CPP_COMMIT:-unknown}" >"$stage/$build/llama-cpp/commit.txt"
fi

find "$build" -name CTestTestfile.cmake -print0 | while IFS= read -r -d '' f; do
  mkdir -p "$stage/$(dirname "$f")"
  cp "$f" "$stage/$f"
done

mapfile -t proto_files < <(cd protos && ls tandem/v1/*.proto)
(cd protos && protoc --proto_path=. --python_out="$stage/$build/py-stubs" \
  --grpc_out="$stage/$build/py-stubs" --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin \
  "${proto_files[@]}")

tar -C "$stage" -cf - "$build" | xz -T0 -9 >"$archive"
echo "packed ${#bins[@]} binaries, $(ls "$stage/$build/prebuilt-lib" | wc -l) libraries" \
  "$([[ -d $stage/$build/llama-cpp ]] && echo "and llama.cpp's server")" \
  "$([[ -d $stage/$build/llama-cpp-src ]] && echo "and llama.cpp's sources"):" \
  "$archive ($(du -h "$archive" | cut -f1); the device tool carries 64 MiB with the working tree)"
