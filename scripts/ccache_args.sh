# Sourced by the build scripts. UNITY_ARGS: the scripts compile each target's sources in bundles
# (TANDEM_UNITY, cmake/tandem.cmake: a cold build in about half the time); TANDEM_UNITY=0 turns
# that off (an edit then recompiles one file rather than its bundle).
UNITY_ARGS=(-DTANDEM_UNITY="$([ "${TANDEM_UNITY:-1}" = 0 ] && echo OFF || echo ON)")
# CCACHE_LAUNCHER: when ccache is installed (scripts/setup.sh installs it), its cache directory is
# writable and TANDEM_CCACHE is not 0, the cmake arguments that compile through it (otherwise
# nothing: a plain build). Paths are hashed relative to the checkout, so clones in other
# directories share the cache (default location ~/.cache/ccache). A cold cache costs nothing but
# the cache writes.
CCACHE_LAUNCHER=()
if [ "${TANDEM_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  ccache_dir="${CCACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/ccache}"
  if mkdir -p "$ccache_dir" 2>/dev/null && [ -w "$ccache_dir" ]; then
    export CCACHE_DIR="$ccache_dir"
    export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
    CCACHE_LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                     -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
fi
