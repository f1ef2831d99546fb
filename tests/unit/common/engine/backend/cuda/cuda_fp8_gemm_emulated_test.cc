// cuda_fp8_gemm_test.cc against the CPU emulator of the CUDA backend.
#include "tests/gpu/cuda_fp8_gemm_test.cc"
