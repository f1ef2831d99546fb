#include "common/cuda/emulation/fake_cuda.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda/emulation/reference_gemm.h"

// A stream runs its operations synchronously on the caller's thread, except after an
// asynchronous one (StreamEnqueueAsync: the emulated NCCL's sends and receives, which wait for
// a peer): from then on, until the stream drains, operations queue behind it on the stream's
// own thread, so stream order holds as on a GPU.
// A deferred stream (created while SetDeferredStreams(true)) runs nothing at enqueue: its
// operations wait in `deferred` until the host waits for them (cudaStreamSynchronize, an event
// recorded behind them, cudaDeviceSynchronize, destruction), and run then, in order, on the
// waiting thread. A host that reads results it has not waited for reads what was there before.
struct CUstream_st {
  CUgraph_st* capturing = nullptr;
  bool defer = false;
  std::vector<std::function<void()>> deferred;  // not run yet, in stream order
  uint64_t enqueued = 0;                        // operations ever deferred on this stream
  uint64_t executed = 0;                        // of those, run
  // Runs the deferred operations up to number `mark` (exclusive).
  void RunDeferredUntil(uint64_t mark) {
    while (executed < mark && executed < enqueued) {
      const size_t i = deferred.size() - static_cast<size_t>(enqueued - executed);
      std::function<void()> op = std::move(deferred[i]);
      ++executed;
      op();
    }
    if (executed == enqueued) deferred.clear();
  }
  void RunDeferred() { RunDeferredUntil(enqueued); }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> pending;  // the front one is running
  std::thread worker;
  bool stop = false;

  bool busy() {
    std::lock_guard<std::mutex> lock(mu);
    return !pending.empty();
  }
  void Push(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu);
    if (!worker.joinable()) worker = std::thread([this] { Run(); });
    pending.push_back(std::move(op));
    cv.notify_all();
  }
  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !pending.empty(); });
      if (pending.empty()) return;
      std::function<void()> op = pending.front();
      lock.unlock();
      op();
      lock.lock();
      pending.pop_front();
      cv.notify_all();
    }
  }
  void Drain() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending.empty(); });
  }
  ~CUstream_st() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      cv.notify_all();
    }
    if (worker.joinable()) worker.join();
  }
};
// An event's records, numbered: `recorded` is the latest record made, `completed` the latest
// that completed (records on one stream complete in order). Shared with the operations that
// complete or wait for it, so destroying an event with work pending is safe, as on a GPU.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  void Complete(uint64_t record) {
    std::lock_guard<std::mutex> lock(mu);
    if (record > completed) completed = record;
    cv.notify_all();
  }
  void WaitFor(uint64_t record) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= record; });
  }
};
struct CUevent_st {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
  // A record on a deferred stream completes when the host runs that stream's operations up to
  // `mark` (the record's own included): the stream of the last record, or null.
  cudaStream_t stream = nullptr;
  uint64_t mark = 0;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

constexpr size_t kTotalMemory = size_t{16} << 30;

std::atomic<bool> g_defer_streams{false};
std::atomic<int> g_compute_capability{90};
std::atomic<int64_t> g_event_waits{0};
std::atomic<int64_t> g_stream_syncs{0};  // cudaStreamSynchronize and cudaDeviceSynchronize
std::atomic<int64_t> g_event_waits_with_later_work{0};
std::mutex g_streams_mutex;
std::set<cudaStream_t>& DeferredStreams() {
  static auto* s = new std::set<cudaStream_t>();
  return *s;
}

std::mutex g_alloc_mutex;
std::map<void*, size_t>& Allocations() {
  static auto* m = new std::map<void*, size_t>();
  return *m;
}
size_t g_allocated = 0;
// Page-locked host allocations (cudaMallocHost): base -> bytes, under g_alloc_mutex.
std::map<const void*, size_t>& PinnedAllocations() {
  static auto* m = new std::map<const void*, size_t>();
  return *m;
}
int64_t g_pinned_bytes = 0;
std::atomic<int64_t> g_pageable_async_copies{0};

// Whether [ptr, ptr + bytes) lies inside one cudaMallocHost allocation. g_alloc_mutex held.
bool InPinnedLocked(const void* ptr, size_t bytes) {
  auto it = PinnedAllocations().upper_bound(ptr);
  if (it == PinnedAllocations().begin()) return false;
  --it;
  const auto* base = static_cast<const uint8_t*>(it->first);
  const auto* p = static_cast<const uint8_t*>(ptr);
  return p >= base && p + bytes <= base + it->second;
}

// Runs `op` now, or records it when `stream` is capturing, or defers it on a deferred stream.
void Enqueue(cudaStream_t stream, std::function<void()> op) {
  if (stream != nullptr && stream->capturing != nullptr) {
    stream->capturing->ops.push_back(std::move(op));
    return;
  }
  if (stream != nullptr && stream->defer) {
    stream->deferred.push_back(std::move(op));
    ++stream->enqueued;
    return;
  }
  if (stream != nullptr && stream->busy()) {
    stream->Push(std::move(op));
    return;
  }
  op();
}

float LoadElement(const void* p, cudaDataType_t type, size_t index) {
  if (type == CUDA_R_16BF) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[index]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  return static_cast<const float*>(p)[index];
}

}  // namespace

namespace tandem::cuda_emu {
void StreamEnqueueAsync(cudaStream_t stream, std::function<void()> op) {
  if (stream == nullptr) {
    op();  // the legacy default stream: synchronous
    return;
  }
  if (stream->defer) stream->RunDeferred();  // what precedes it, then it on the thread
  stream->Push(std::move(op));
}
void EnqueueOnStream(const void* stream, std::function<void()> op) {
  Enqueue(static_cast<CUstream_st*>(const_cast<void*>(stream)), std::move(op));
}
void SetDeferredStreams(bool defer) { g_defer_streams = defer; }
void SetComputeCapability(int major, int minor) { g_compute_capability = major * 10 + minor; }
int ComputeCapability() { return g_compute_capability; }
int64_t EventWaits() { return g_event_waits; }
int64_t StreamSyncs() { return g_stream_syncs; }
int64_t PinnedBytes() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return g_pinned_bytes;
}
bool IsPinned(const void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return InPinnedLocked(ptr, bytes);
}
int64_t PageableAsyncCopies() { return g_pageable_async_copies; }
int64_t EventWaitsWithLaterWork() { return g_event_waits_with_later_work; }
std::vector<std::function<void()>>* CaptureList(const void* stream) {
  auto* s = static_cast<CUstream_st*>(const_cast<void*>(stream));
  return s != nullptr && s->capturing != nullptr ? &s->capturing->ops : nullptr;
}
}  // namespace tandem::cuda_emu

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorMapBufferObjectFailed:
      return "cudaErrorMapBufferObjectFailed";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }
cudaError_t cudaGetLastError() { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "Tandem CUDA emulator (CPU)", sizeof prop->name - 1);
  // The identity of the emulated GPU: a hash of its name, so equal names are one device.
  const std::string name = tandem::cuda_emu::EmulatedGpuName();
  uint64_t h1 = 1469598103934665603ull, h2 = 1099511628211ull;
  for (char c : name) {
    h1 = (h1 ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    h2 = (h2 + static_cast<uint8_t>(c)) * 6364136223846793005ull + 1;
  }
  std::memcpy(prop->uuid.bytes, &h1, 8);
  std::memcpy(prop->uuid.bytes + 8, &h2, 8);
  prop->pciBusID = static_cast<int>(h1 & 0xff);
  prop->totalGlobalMem = kTotalMemory;
  prop->multiProcessorCount = 4;
  prop->major = g_compute_capability / 10;
  prop->minor = g_compute_capability % 10;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 4;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = g_compute_capability / 10;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = g_compute_capability % 10;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 * 1024;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  *total = kTotalMemory;
  *free = kTotalMemory > g_allocated ? kTotalMemory - g_allocated : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  ++g_stream_syncs;
  std::vector<cudaStream_t> streams;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    streams.assign(DeferredStreams().begin(), DeferredStreams().end());
  }
  for (cudaStream_t s : streams) s->RunDeferred();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  void* p = bytes >= tandem::cuda_emu::kIpcMinBytes
                ? tandem::cuda_emu::SharedAlloc(bytes)
                : std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  Allocations()[p] = bytes;
  g_allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  cudaDeviceSynchronize();  // as the runtime does: no pending operation reads freed memory
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  auto it = Allocations().find(ptr);
  if (it == Allocations().end()) return cudaErrorInvalidValue;
  g_allocated -= it->second;
  Allocations().erase(it);
  if (!tandem::cuda_emu::SharedFree(ptr)) std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  PinnedAllocations()[*ptr] = bytes;
  g_pinned_bytes += static_cast<int64_t>(bytes);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  cudaDeviceSynchronize();
  {
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    auto it = PinnedAllocations().find(ptr);
    if (it == PinnedAllocations().end()) return cudaErrorInvalidValue;
    g_pinned_bytes -= static_cast<int64_t>(it->second);
    PinnedAllocations().erase(it);
  }
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost) {
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    if (!InPinnedLocked(kind == cudaMemcpyHostToDevice ? src : dst, bytes)) {
      ++g_pageable_async_copies;
    }
  }
  Enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  Enqueue(stream, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = new CUstream_st();
  if (g_defer_streams) {
    (*stream)->defer = true;
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    DeferredStreams().insert(*stream);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream != nullptr && stream->defer) {
    stream->RunDeferred();  // a stream's work completes before it is destroyed
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    DeferredStreams().erase(stream);
  }
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr && stream->capturing != nullptr) return cudaErrorStreamCaptureInvalidated;
  ++g_stream_syncs;
  if (stream != nullptr) {
    stream->RunDeferred();
    stream->Drain();
  }
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (stream != nullptr && stream->executed < stream->enqueued) return cudaErrorNotReady;
  return stream != nullptr && stream->busy() ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (stream != nullptr && stream->capturing != nullptr) return cudaErrorNotSupported;
  std::shared_ptr<EventState> st = event->state;
  uint64_t record;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    record = ++st->recorded;
  }
  // In stream order: at once on an idle stream, behind the queued work on a busy one, and on a
  // deferred stream when the host waits for it.
  Enqueue(stream, [st, record] { st->Complete(record); });
  event->stream = stream != nullptr && stream->defer ? stream : nullptr;
  event->mark = event->stream != nullptr ? stream->enqueued : 0;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (event->stream != nullptr && event->stream->executed < event->mark) return cudaErrorNotReady;
  std::lock_guard<std::mutex> lock(event->state->mu);
  return event->state->completed >= event->state->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  ++g_event_waits;
  if (cudaStream_t s = event->stream; s != nullptr) {
    // Work the host enqueued behind the event before waiting for it: the steps overlap.
    if (s->enqueued > event->mark) ++g_event_waits_with_later_work;
    s->RunDeferredUntil(event->mark);
  }
  std::shared_ptr<EventState> st = event->state;
  uint64_t record;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    record = st->recorded;
  }
  st->WaitFor(record);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (stream != nullptr && stream->capturing != nullptr) return cudaErrorNotSupported;
  // A record on a deferred stream has no thread to complete it: the host runs it here.
  if (event->stream != nullptr && event->stream != stream) {
    event->stream->RunDeferredUntil(event->mark);
  }
  std::shared_ptr<EventState> st = event->state;
  uint64_t record;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->completed >= st->recorded) return cudaSuccess;  // nothing pending: no wait
    record = st->recorded;
  }
  // The stream's later work queues behind the wait, on the stream's own thread.
  tandem::cuda_emu::StreamEnqueueAsync(stream, [st, record] { st->WaitFor(record); });
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr || stream->capturing != nullptr) return cudaErrorInvalidValue;
  stream->capturing = new CUgraph_st();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr || stream->capturing == nullptr) return cudaErrorInvalidValue;
  *graph = stream->capturing;
  stream->capturing = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  for (const auto& op : exec->ops) Enqueue(stream, op);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void*, size_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

// Column-major C = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n; beta == 0 does
// not read C (like cuBLAS).
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != Btype || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m < 0 || n < 0 || k < 0 || lda < (transa == CUBLAS_OP_N ? m : k) ||
      ldb < (transb == CUBLAS_OP_N ? k : n) || ldc < m) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  Enqueue(handle->stream, [=] {
    float* c = static_cast<float*>(C);
    tandem::cuda_emu::ReferenceGemm<double>(
        m, n, k,
        [&](int64_t i, int64_t l) {
          return LoadElement(A, Atype, transa == CUBLAS_OP_N ? i + l * lda : l + i * lda);
        },
        [&](int64_t l, int64_t j) {
          return LoadElement(B, Btype, transb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb);
        },
        [&](int64_t i, int64_t j, double acc) {
          float& out = c[i + j * ldc];
          out = b == 0.0f ? static_cast<float>(a * acc) : static_cast<float>(a * acc + b * out);
        });
  });
  return CUBLAS_STATUS_SUCCESS;
}
