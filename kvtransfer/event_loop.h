#pragma once

// One thread that runs posted functions in order and a periodic tick (deadline checks,
// housekeeping). Transports deliver every user callback through one of these, so callbacks
// never run under a transport lock and never on the caller's thread.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace tandem::kvtransfer {

class EventLoop {
 public:
  // `tick` (may be empty) runs about every `tick_period` on the loop thread.
  EventLoop(std::string name, absl::Duration tick_period, std::function<void()> tick);
  // Runs what is already posted, then joins. Posts after Stop are dropped.
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void Post(std::function<void()> fn);
  // Idempotent; must not be called from the loop thread.
  void Stop();
  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Run();

  const std::string name_;
  const absl::Duration tick_period_;
  const std::function<void()> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem::kvtransfer
