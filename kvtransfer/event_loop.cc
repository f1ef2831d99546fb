#include "kvtransfer/event_loop.h"

#include <pthread.h>

#include <chrono>
#include <utility>

namespace tandem::kvtransfer {

EventLoop::EventLoop(std::string name, absl::Duration tick_period, std::function<void()> tick)
    : name_(std::move(name)), tick_period_(tick_period), tick_(std::move(tick)) {
  thread_ = std::thread([this] { Run(); });
}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void EventLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EventLoop::Run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  const auto period = absl::ToChronoMilliseconds(tick_period_);
  auto next_tick = std::chrono::steady_clock::now() + period;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // The tick runs when due even while work is queued (deadlines must not starve).
    if (tick_ && std::chrono::steady_clock::now() >= next_tick) {
      lock.unlock();
      tick_();
      lock.lock();
      next_tick = std::chrono::steady_clock::now() + period;
      continue;
    }
    if (!queue_.empty()) {
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
      continue;
    }
    if (stop_) return;
    if (tick_) {
      cv_.wait_until(lock, next_tick);
    } else {
      cv_.wait(lock);
    }
  }
}

}  // namespace tandem::kvtransfer
