#pragma once

// One two-rank NCCL communicator (a prefill GPU and a decode GPU) with its CUDA stream and
// small staging buffers. Nonblocking (config.blocking = 0): every wait polls the stream and
// ncclCommGetAsyncError with a deadline, and a communicator that misses its deadline or fails
// is aborted (ncclCommAbort), so no transfer hangs on a vanished peer.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl/cuda_nccl.h"

namespace tandem::kvtransfer::nccl {

// Fixed-size message header sent before each DATA message's regions.
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr uint32_t kHeaderMagic = 0x4e4b5654;  // "TVKN"
struct MessageHeader {
  uint32_t magic;
  uint32_t count;  // regions that follow
  uint64_t transfer_id;
  uint32_t attempt;
  uint32_t layer;
  uint32_t reserved;
  uint32_t crc;  // CRC32C of the header with crc = 0
  int32_t blocks[(kHeaderBytes - 32) / 4];
};
static_assert(sizeof(MessageHeader) == kHeaderBytes);
inline constexpr size_t kMaxBlocksPerMessage = (kHeaderBytes - 32) / 4;

class Communicator {
 public:
  // Joins communicator `id` as `rank` (0: sender, 1: receiver) on `device`; returns at once,
  // WaitReady finishes the setup. `scratch_bytes` of device memory absorb discarded regions.
  static absl::StatusOr<std::unique_ptr<Communicator>> Start(const std::string& unique_id, int rank,
                                                             int device, size_t scratch_bytes);
  ~Communicator();  // finalizes (bounded) or aborts
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  absl::Status WaitReady(absl::Time deadline, const std::atomic<bool>* stop);

  // Enqueue on the stream; complete with Wait.
  // Later work of the stream waits (on the device) for `event`'s latest record (a cudaEvent_t).
  absl::Status WaitEvent(void* event);
  absl::Status Send(const void* device_buffer, size_t bytes);
  absl::Status Recv(void* device_buffer, size_t bytes);
  absl::Status GroupStart();
  absl::Status GroupEnd();
  absl::Status HeaderToDevice();  // host_header() -> device_header()
  absl::Status HeaderToHost();    // device_header() -> host_header()

  // Until all enqueued work completed. On an NCCL error, at `deadline` or when *stop turns true
  // the communicator is aborted (broken() from then on).
  absl::Status Wait(absl::Time deadline, const std::atomic<bool>* stop);
  void Abort();
  bool broken() const { return broken_; }

  MessageHeader* host_header() { return host_header_; }
  void* device_header() { return device_header_; }
  void* device_scratch() { return device_scratch_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  int device() const { return device_; }

 private:
  Communicator() = default;
  absl::Status Check(ncclResult_t r, const char* what);

  int rank_ = 0;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  MessageHeader* host_header_ = nullptr;  // pinned
  void* device_header_ = nullptr;
  void* device_scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::atomic<bool> broken_{false};
};

// A random ncclUniqueId, as bytes.
absl::StatusOr<std::string> NewUniqueId();
// OK when a CUDA device is usable.
absl::Status CheckDevice(int device);

}  // namespace tandem::kvtransfer::nccl
