#pragma once

// The CUDA runtime and NCCL as the nccl transport sees them: the real ones, or in the GPU
// emulation build (TANDEM_CUDA_EMULATION, tests only) the CPU emulator's stand-ins
// (common/engine/backend/cuda/emulation: fake_cuda.h, fake_nccl.h).

#include "kvtransfer/cuda_runtime_api.h"

#if TANDEM_CUDA_EMULATION
#include "common/engine/backend/cuda/emulation/fake_nccl.h"
#else
#include <nccl.h>
#endif
