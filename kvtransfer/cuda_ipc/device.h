#pragma once

// The CUDA side of the cuda-ipc transport: which physical GPU a device is, exporting the
// receiver's KV pool allocation once, mapping it in the sender, and device-to-device copies on
// a stream with a deadline.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::cuda_ipc {

// OK when CUDA device `device` is usable.
absl::Status CheckDevice(int device);

// The physical identity of CUDA device `device`: "GPU-<uuid>" as nvidia-smi prints it (the
// emulator derives the uuid from TANDEM_EMULATED_GPU). Two processes are on one GPU exactly when
// their ids are equal, whatever CUDA_VISIBLE_DEVICES renumbered.
absl::StatusOr<std::string> DeviceId(int device);

// The IPC handle (cudaIpcMemHandle_t bytes) of the allocation that starts at `base`.
absl::StatusOr<std::string> ExportHandle(int device, void* base);

// A peer's exported allocation mapped into this process (cudaIpcOpenMemHandle); closed
// (cudaIpcCloseMemHandle) when destroyed, once no copy uses it.
class MappedPool {
 public:
  static absl::StatusOr<std::unique_ptr<MappedPool>> Open(int device, const std::string& handle,
                                                          uint64_t bytes);
  ~MappedPool();
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  MappedPool(int device, uint8_t* base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes) {}
  const int device_;
  uint8_t* const base_;
  const uint64_t bytes_;
};

// A non-blocking stream on `device` for the sender's copies.
class CopyStream {
 public:
  static absl::StatusOr<std::unique_ptr<CopyStream>> Create(int device);
  ~CopyStream();
  int device() const { return device_; }
  // Queues a device-to-device copy.
  absl::Status Copy(void* dst, const void* src, size_t bytes);
  // Later work of the stream waits (on the device) for `event`'s latest record.
  absl::Status WaitEvent(void* event);
  // Records `event` (from CreateEvent) after the work queued so far.
  absl::Status Record(void* event);
  // Waits for the queued copies, polling until `deadline` or `*stop` (DEADLINE_EXCEEDED,
  // CANCELLED; then the stream is unusable).
  absl::Status Wait(absl::Time deadline, const std::atomic<bool>* stop);

 private:
  explicit CopyStream(int device) : device_(device) {}
  const int device_;
  void* stream_ = nullptr;  // cudaStream_t
};

// A cudaEvent_t without timing on `device`, and its release.
absl::StatusOr<void*> CreateEvent(int device);
void DestroyEvent(int device, void* event);
// Waits until `event`'s latest record completed, polling until `deadline` or `*stop` (may be
// null): DEADLINE_EXCEEDED, CANCELLED.
absl::Status WaitEvent(void* event, absl::Time deadline, const std::atomic<bool>* stop);

}  // namespace tandem::kvtransfer::cuda_ipc
