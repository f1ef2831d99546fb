#pragma once

// State of the NCCL sender: a Peer per receiver endpoint (communicator, worker thread, queue),
// the transfers on it and the work items its worker runs.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::nccl {

struct Peer;

struct Transfer {
  TransferHandle handle = 0;
  TransferTarget target;
  std::vector<int32_t> src_blocks;
  std::shared_ptr<Peer> peer;
  absl::Time started;
  // Under the sender's mutex.
  bool ended = false;
  absl::Status outcome;
  bool finish_called = false;
  KvSender::DoneCallback done;
  std::vector<bool> layer_queued;
  bool device_busy = false;  // a message of it is on the wire: done waits for it
  bool done_deferred = false;
  // Worker thread only.
  uint64_t frames_sent = 0;
  uint64_t bytes_sent = 0;
};

struct Item {
  enum class Kind { kData, kFinish, kAbort } kind = Kind::kData;
  std::shared_ptr<Transfer> transfer;
  int64_t layer = 0;
  size_t first = 0;
  size_t count = 0;
  std::string trailer;
  absl::Status status;
};

struct Peer {
  std::string endpoint;
  uint64_t incarnation = 0;
  std::unique_ptr<Communicator> comm;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  std::atomic<bool> stop{false};
  std::atomic<bool> broken{false};
  // Under the sender's mutex.
  absl::Time last_used;
  int active = 0;  // transfers not ended
  bool idle() const { return active == 0; }
};

}  // namespace tandem::kvtransfer::nccl
