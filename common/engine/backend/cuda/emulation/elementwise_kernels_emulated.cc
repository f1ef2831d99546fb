// elementwise_kernels.cu compiled by the host compiler against the CPU emulator.
#include "common/engine/backend/cuda/elementwise_kernels.cu"
