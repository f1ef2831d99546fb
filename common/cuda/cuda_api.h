#pragma once

// The CUDA runtime, cuBLAS, cuBLASLt and NCCL as Tandem's GPU code (the CUDA backend, the nccl and
// cuda-ipc KV transports) sees them: the real headers, or under TANDEM_CUDA_EMULATION (the CPU
// emulator, tandem_cuda_emulator in this folder: the tests and the test-only GPU emulation build)
// host stand-ins with the same names and signatures (emulation/fake_cuda.h,
// emulation/fake_cublaslt.h, emulation/fake_nccl.h). NCCL's declarations come only where the build
// found NCCL (TANDEM_HAVE_NCCL) or emulates it.

#if defined(TANDEM_CUDA_EMULATION)
#include "common/cuda/emulation/fake_cublaslt.h"
#include "common/cuda/emulation/fake_cuda.h"
#include "common/cuda/emulation/fake_nccl.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#if defined(TANDEM_HAVE_NCCL)
#include <nccl.h>
#endif
#endif
