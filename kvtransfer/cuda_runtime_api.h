#pragma once

// The CUDA runtime as the device transports (nccl, cuda-ipc) see it: the real one, or in the GPU
// emulation build (TANDEM_CUDA_EMULATION, tests only) the CPU emulator's stand-in
// (common/engine/backend/cuda/emulation/fake_cuda.h, with IPC between processes).

#if TANDEM_CUDA_EMULATION
#include "common/engine/backend/cuda/emulation/fake_cuda.h"
#else
#include <cuda_runtime.h>
#endif
