// cuda_fp8_backend_test.cc against the CPU emulator of the CUDA backend.
#include "tests/gpu/cuda_fp8_backend_test.cc"
