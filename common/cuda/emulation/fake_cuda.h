#pragma once

// Host-only stand-ins for the CUDA runtime and cuBLAS calls the backend makes, with the real
// names and signatures, for the emulation build (TANDEM_CUDA_EMULATION). "Device" memory is host
// memory (new allocations are filled with 0xff bytes, so reading an unwritten float gives NaN),
// every stream operation runs synchronously (until an asynchronous one, StreamEnqueueAsync, is
// queued: then later ones queue behind it on the stream's own thread), graph capture records
// operations for replay, and cublasGemmEx is a plain column-major loop with double accumulation.
// One emulated device per process. Its identity (cudaDeviceProp::uuid, pciBusID) comes from the
// environment variable TANDEM_EMULATED_GPU (a name; default "0"), so processes that set the same
// name share one emulated GPU and the KV transport can tell "same GPU" from "another GPU".
// CUDA IPC between processes on one emulated GPU: allocations of at least
// kIpcMinBytes are backed by a memfd (MAP_SHARED); cudaIpcGetMemHandle encodes how another
// process maps it (owner pid, fd number, inode, size, device), never a raw pointer, and
// cudaIpcOpenMemHandle maps it there through /proc/<pid>/fd (fake_cuda_ipc.cc).

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/cuda/emulation/emulator.h"

using dim3 = ::tandem::cuda_emu::Dim3;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNotReady = 600,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureInvalidated = 901,
};

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
struct CUevent_st;
typedef CUevent_st* cudaEvent_t;
struct CUgraph_st;
typedef CUgraph_st* cudaGraph_t;
struct CUgraphExec_st;
typedef CUgraphExec_st* cudaGraphExec_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct CUuuid_st {
  char bytes[16];
};
typedef CUuuid_st cudaUUID_t;

struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;
  int pciBusID;
  int pciDeviceID;
  int pciDomainID;
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major;
  int minor;
};

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);

// CUDA IPC (legacy handles), as the runtime declares them.
#define CUDA_IPC_HANDLE_SIZE 64
typedef struct cudaIpcMemHandle_st {
  char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;
#define cudaIpcMemLazyEnablePeerAccess 0x01
// Only the base of an allocation of at least kIpcMinBytes can be exported (the runtime exports
// whole allocations too); cudaErrorInvalidValue otherwise.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr);
// Maps the allocation in this process. Like the runtime, refuses a handle of this process
// (cudaErrorInvalidResourceHandle) and, here, one of another emulated GPU
// (cudaErrorInvalidDevice); cudaErrorMapBufferObjectFailed when the owner is gone.
cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void* dev_ptr);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
// Events, as the runtime defines them: a record completes once the work queued on its stream
// before it completed; cudaStreamWaitEvent makes the stream's later work wait (on the stream's
// own thread, never the caller's) for the event's latest record at the time of the call;
// waiting for an event never recorded returns at once.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
template <class T>
cudaError_t cudaFuncSetAttribute(T* /*kernel*/, cudaFuncAttribute /*attr*/, int /*value*/) {
  return cudaSuccess;
}

namespace tandem::cuda_emu {
inline constexpr size_t kIpcMinBytes = size_t{64} << 10;
// The emulated device's name (TANDEM_EMULATED_GPU, default "0").
const char* EmulatedGpuName();
// Shareable "device" memory (fake_cuda_ipc.cc): a memfd mapping, registered for export.
void* SharedAlloc(size_t bytes);
// False when `ptr` is not a SharedAlloc allocation.
bool SharedFree(void* ptr);
// Queues `op` on `stream` to run on the stream's own thread, in stream order: what an operation
// that waits for something outside the device (the emulated NCCL's peer) needs. The stream
// reports cudaErrorNotReady until it has drained.
void StreamEnqueueAsync(cudaStream_t stream, std::function<void()> op);
// Deferred streams: streams created while this is on (default off) run nothing at enqueue; their
// operations run, in order, on the thread that waits for them (cudaStreamSynchronize,
// cudaEventSynchronize of an event recorded behind them, cudaDeviceSynchronize), so a host that
// reads a result it has not waited for reads stale memory, as it may on a GPU. Tests of
// asynchronous code turn it on.
void SetDeferredStreams(bool defer);
// Every cudaEventSynchronize, and those that found operations enqueued behind the event on its
// stream (the host had launched later work before waiting: overlap), since the process started.
int64_t EventWaits();
int64_t EventWaitsWithLaterWork();
// Every cudaStreamSynchronize and cudaDeviceSynchronize since the process started: a host
// waiting for all of a stream's work (what code meant to overlap with the device must not do).
int64_t StreamSyncs();
// The compute capability the emulated device reports (cudaGetDeviceProperties,
// cudaDeviceGetAttribute; default 9.0, an H100 / H200), and what the cuBLASLt stand-ins accept
// (fake_cublaslt.h). Tests set it to check what a backend does on other devices.
void SetComputeCapability(int major, int minor);
int ComputeCapability();  // major * 10 + minor
// Page-locked host memory: bytes allocated by cudaMallocHost and not freed yet; whether
// [ptr, ptr + bytes) lies inside one such allocation; and every cudaMemcpyAsync between the device
// and host memory that is not (the runtime stages such a copy itself and the host waits for it:
// not the direct DMA asynchronous code means), since the process started.
int64_t PinnedBytes();
bool IsPinned(const void* ptr, size_t bytes);
int64_t PageableAsyncCopies();
}  // namespace tandem::cuda_emu

// cuBLAS
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
struct cublasContext;
typedef cublasContext* cublasHandle_t;
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28 };
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
