#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace tandem::grammar {

// What one compilation may spend: CPU time on its thread, and a cancel flag another thread may
// raise. The compiler checks it inside its expensive loops (parsing, rule analysis, JSON Schema
// subschemas, Earley closures and token-trie walks while warming the first mask) and gives up at
// the first check past it, so an abandoned compile frees its thread within a few microseconds of
// work. CPU time rather than wall time: a compile descheduled by other load is not cut for it.
//
// Thread-safety: Check() and the accessors below it on the one compiling thread; Cancel() and
// cancelled() from any thread.
class CompileBudget {
 public:
  // Unlimited and never cancelled unless Cancel() is called.
  CompileBudget() = default;
  // At most `cpu_ms` milliseconds of the compiling thread's CPU time, counted from the first
  // Check(); <= 0: unlimited.
  explicit CompileBudget(int64_t cpu_ms) : cpu_us_(cpu_ms * 1000) {}
  // At most `cpu_us` microseconds (<= 0: unlimited); `what` names the work in the budget's
  // error ("computing a token mask").
  static std::unique_ptr<CompileBudget> Micros(int64_t cpu_us, std::string what) {
    auto b = std::make_unique<CompileBudget>();
    b->cpu_us_ = cpu_us;
    b->what_ = std::move(what);
    return b;
  }
  CompileBudget(const CompileBudget&) = delete;
  CompileBudget& operator=(const CompileBudget&) = delete;

  // Names the work in the budget's error (before the first Check()).
  void set_what(std::string what) { what_ = std::move(what); }
  // Any thread: the compile stops at its next Check().
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // OK within the budget; INVALID_ARGUMENT naming the budget once the CPU time is spent (the
  // grammar is too expensive to serve: retrying does not help; IsBudgetExceeded tells it from
  // other errors); CANCELLED once cancelled. Sticky:
  // once failed it keeps failing. Cheap: the CPU clock is read once every 256 calls.
  absl::Status Check() {
    if (!failed_ && ++calls_ % 256 != 1 && !cancelled()) return absl::OkStatus();
    return CheckNow();
  }
  // True once Check() failed.
  bool failed() const { return failed_; }
  // The CPU time spent since the first Check() (0 before it), in milliseconds.
  double cpu_ms_used() const;
  int64_t cpu_ms_limit() const { return cpu_us_ / 1000; }

 private:
  absl::Status CheckNow();

  int64_t cpu_us_ = 0;
  std::string what_ = "compiling the grammar";
  std::atomic<bool> cancelled_{false};
  bool failed_ = false;
  absl::Status status_;
  uint64_t calls_ = 0;
  int64_t start_ns_ = -1;  // the thread's CPU clock at the first Check()
};

// Whether `status` is a CompileBudget's "ran past its CPU time" error (not an invalid grammar,
// not a cancellation).
bool IsBudgetExceeded(const absl::Status& status);

}  // namespace tandem::grammar
