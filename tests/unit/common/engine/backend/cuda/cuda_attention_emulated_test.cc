// cuda_attention_test.cc against the CPU emulator of the CUDA backend (TANDEM_CUDA_EMULATION comes
// with tandem_backend_cuda_emulated).
#include "tests/gpu/cuda_attention_test.cc"
