# Cross-compiling for aarch64 Linux with Debian's cross toolchain (g++-aarch64-linux-gnu) and the
# arm64 multiarch -dev packages (scripts/setup.sh); tests run under qemu-user
# (scripts/cross_aarch64.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and packages of the target only (the arm64 ones under /usr/lib/aarch64-linux-gnu and
# the C library's under /usr/aarch64-linux-gnu); programs of the build machine.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# Under qemu-user, the target's dynamic loader and C library must come from one package: the
# arm64 libc6 (multiarch, under /lib/aarch64-linux-gnu, where the loader's search also finds
# libc.so.6, libstdc++ and the -dev packages' libraries). The cross toolchain's copy under
# /usr/aarch64-linux-gnu is a different Debian revision of glibc: its loader with the multiarch
# libc.so.6 (private ABI between the two, e.g. the thread-stack cache list in _rtld_global)
# made every pthread_create spin forever.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
# aarch64's baseline has FMA, so GCC would contract a * b + c into one rounding in every file,
# while x86-64's baseline has none: the tests' scalar references (e.g. quant_matmul_test's
# (dot * scale) + bias) then differ from the kernels, which round twice as specified (they are
# built with -ffp-contract=off on every architecture). Off everywhere keeps the bits of plain
# C++ arithmetic the same on both architectures.
set(CMAKE_C_FLAGS_INIT "-ffp-contract=off")
set(CMAKE_CXX_FLAGS_INIT "-ffp-contract=off")
