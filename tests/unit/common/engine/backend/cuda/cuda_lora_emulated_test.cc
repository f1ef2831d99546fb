// cuda_lora_test.cc against the CPU emulator of the CUDA backend.
#include "tests/gpu/cuda_lora_test.cc"
