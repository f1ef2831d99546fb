// cuda_quant_backend_test.cc against the CPU emulator of the CUDA backend.
#include "tests/gpu/cuda_quant_backend_test.cc"
