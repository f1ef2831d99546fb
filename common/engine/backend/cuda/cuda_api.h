#pragma once

// The CUDA runtime and cuBLAS declarations the backend uses: the real headers, or in the CPU
// emulation build (TANDEM_CUDA_EMULATION) host-only stand-ins with the same names
// (emulation/fake_cuda.h).

#if defined(TANDEM_CUDA_EMULATION)
#include "common/engine/backend/cuda/emulation/fake_cuda.h"
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif
