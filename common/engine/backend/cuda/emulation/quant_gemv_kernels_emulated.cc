// quant_gemv_kernels.cu compiled by the host compiler against the CPU emulator.
#include "common/engine/backend/cuda/quant_gemv_kernels.cu"
