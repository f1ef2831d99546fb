#pragma once

// One two-rank NCCL communicator (a prefill GPU and a decode GPU) with its CUDA stream and
// small staging buffers. Nonblocking (config.blocking = 0): every wait polls the stream and
// ncclCommGetAsyncError with a deadline, and a communicator that misses its deadline or fails
// is aborted (ncclCommAbort), so no transfer hangs on a vanished peer.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cuda/cuda_api.h"

namespace tandem::kvtransfer::nccl {

// Fixed-size message header sent before each DATA message's regions. Protocol 2: the regions
// travel in runs, one ncclSend / ncclRecv per run of regions adjacent on both sides (bit i of
// `joined` set: region i continues region i-1's run; bit 0 is never set); a run is at most the
// receiver's `max_run_regions` (its WELCOME) long, so a refused one fits its scratch.
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr uint32_t kHeaderMagic = 0x324b5654;  // "TVK2" (protocol 1: "TVKN")
inline constexpr size_t kJoinedBytes = 128;
struct MessageHeader {
  uint32_t magic;
  uint32_t count;  // regions that follow
  uint64_t transfer_id;
  uint32_t attempt;
  uint32_t layer;
  uint32_t reserved;
  uint32_t crc;  // CRC32C of the header with crc = 0
  uint8_t joined[kJoinedBytes];
  int32_t blocks[(kHeaderBytes - 32 - kJoinedBytes) / 4];
};
static_assert(sizeof(MessageHeader) == kHeaderBytes);
inline constexpr size_t kMaxBlocksPerMessage = (kHeaderBytes - 32 - kJoinedBytes) / 4;
static_assert(kMaxBlocksPerMessage <= kJoinedBytes * 8);
// The most bytes one run may carry (the receiver's scratch for a refused run is one run).
inline constexpr size_t kMaxRunBytes = size_t{4} << 20;

inline bool Joined(const MessageHeader& h, size_t i) { return (h.joined[i / 8] >> (i % 8)) & 1; }
inline void SetJoined(MessageHeader* h, size_t i) {
  h->joined[i / 8] = static_cast<uint8_t>(h->joined[i / 8] | (1u << (i % 8)));
}

// One piece of a DATA message: a run of adjacent regions.
struct RegionRun {
  const void* data = nullptr;
  size_t bytes = 0;
};

// A message header's staging on the sender: pinned host memory the header is written in and the
// device buffer it is copied to (on the stream) and sent from. Held until the message completed.
struct HeaderSlot {
  MessageHeader* host = nullptr;
  void* device = nullptr;
};

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

  // The receiver's (one thread): enqueue on the stream; complete with Wait.
  absl::Status Send(const void* device_buffer, size_t bytes);
  absl::Status Recv(void* device_buffer, size_t bytes);
  absl::Status GroupStart();
  absl::Status GroupEnd();
  absl::Status HeaderToHost();  // device_header() -> host_header()

  // Until all enqueued work completed. On an NCCL error, at `deadline` or when *stop turns true
  // the communicator is aborted (broken() from then on).
  absl::Status Wait(absl::Time deadline, const std::atomic<bool>* stop);
  void Abort();

  // The sender's pipelined messages (nccl_sender.cc): its worker thread enqueues, its finisher
  // thread waits per transfer, so these take the communicator's mutex (Abort too).
  // A header slot (from the free list, else allocated); FreeHeaderSlot gives it back.
  absl::StatusOr<HeaderSlot> NewHeaderSlot();
  void FreeHeaderSlot(HeaderSlot slot);
  // Enqueues one DATA message: the stream waits (on the device) for `ready` (a cudaEvent_t;
  // null: none), copies `slot`'s header to the device and sends it, then `runs` (one ncclSend
  // each) as one group, and records `done` (a cudaEvent_t) behind them. Returns once
  // NCCL accepted the work (a nonblocking communicator's ncclInProgress resolved, at most until
  // `deadline`), never waiting for the data.
  absl::Status EnqueueMessage(void* ready, const HeaderSlot& slot,
                              const std::vector<RegionRun>& runs, void* done, absl::Time deadline);
  // Until `event`'s latest record completed; an NCCL error, `deadline` or *stop abort the
  // communicator as Wait does.
  absl::Status WaitFor(void* event, absl::Time deadline, const std::atomic<bool>* stop);
  // A cudaEvent_t without timing, and its release.
  absl::StatusOr<void*> NewEvent();
  void FreeEvent(void* event);
  bool broken() const { return broken_; }

  MessageHeader* host_header() { return host_header_; }
  void* device_header() { return device_header_; }
  void* device_scratch() { return device_scratch_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  int device() const { return device_; }

 private:
  Communicator() = default;
  absl::Status Check(ncclResult_t r, const char* what);
  // Under mu_.
  absl::Status CheckLocked(ncclResult_t r, const char* what);
  void AbortLocked();
  // Under mu_: until the communicator's last call is no longer in progress.
  absl::Status SettleLocked(absl::Time deadline);

  int rank_ = 0;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  MessageHeader* host_header_ = nullptr;  // pinned
  void* device_header_ = nullptr;
  void* device_scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::atomic<bool> broken_{false};
  std::mutex mu_;  // comm_ and the stream between the sender's threads; the free header slots
  std::vector<HeaderSlot> free_slots_;
};

// A random ncclUniqueId, as bytes.
absl::StatusOr<std::string> NewUniqueId();
// OK when a CUDA device is usable.
absl::Status CheckDevice(int device);

}  // namespace tandem::kvtransfer::nccl
