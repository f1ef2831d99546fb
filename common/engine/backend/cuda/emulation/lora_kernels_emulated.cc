// lora_kernels.cu compiled by the host compiler against the CPU emulator.
#include "common/engine/backend/cuda/lora_kernels.cu"
