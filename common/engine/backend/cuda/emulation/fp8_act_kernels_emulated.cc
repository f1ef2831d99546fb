// fp8_act_kernels.cu compiled by the host compiler against the CPU emulator.
#include "common/engine/backend/cuda/fp8_act_kernels.cu"
