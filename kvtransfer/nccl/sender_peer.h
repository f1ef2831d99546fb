#pragma once

// The NCCL sender's link to one receiver endpoint: its communicator (rank 0) and the worker
// thread that runs the queued work in order.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::nccl {

struct Peer : SenderLink {
  std::string endpoint;
  uint64_t incarnation = 0;
  std::unique_ptr<Communicator> comm;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<SenderWork> queue;
  std::atomic<bool> stop{false};
  std::atomic<bool> broken{false};

  // BEGIN went over the control channel inside Begin already: kBegin is not queued.
  void Send(SenderWork work) override {
    if (work.kind == SenderWork::Kind::kBegin) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(work));
    }
    cv.notify_one();
  }
  bool healthy() const override { return !broken; }
};

}  // namespace tandem::kvtransfer::nccl
