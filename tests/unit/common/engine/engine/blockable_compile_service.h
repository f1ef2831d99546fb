#pragma once

// A grammar compile service with one worker that a test can occupy (Block) so that compilations
// and off-loop masks queue behind it until Unblock. Shared by the engine's grammar-wait tests.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/grammar/compile_service.h"

namespace tandem {

struct BlockableCompileService {
  BlockableCompileService(std::shared_ptr<grammar::GrammarCompiler> compiler, int64_t budget_ms) {
    grammar::GrammarCompileServiceOptions o;
    o.threads = 1;
    o.budget_ms = budget_ms;
    service = std::make_shared<grammar::GrammarCompileService>(std::move(compiler), o);
  }
  ~BlockableCompileService() { Unblock(); }
  void Block() {
    open = false;
    started = false;
    blocker = service->SubmitTask("test", "blocking", [this](grammar::CompileBudget*) {
      started = true;
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] { return open; });
      return absl::OkStatus();
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void Unblock() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
    if (blocker != nullptr) blocker->Wait();
    blocker.reset();
  }

  std::shared_ptr<grammar::GrammarCompileService> service;
  std::unique_ptr<grammar::GrammarCompileHandle> blocker;
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  std::atomic<bool> started{false};
};

}  // namespace tandem
