#pragma once

// Fault injection in the engine: compiled in, off by default. Enabled by
// EngineOptions::faults or, when those are off, by the TANDEM_FAULTS environment variable that
// also drives kvtransfer's faults (kvtransfer/faults.h), e.g.
//   TANDEM_FAULTS="engine_stall_ms=200,engine_stall_prob=0.05,kv_alloc_fail_prob=0.02,seed=7"
// engine_stall_ms / engine_stall_prob: a step with work first sleeps that long (with that
// probability, default 1): the engine loop stalls as under a slow device or a long pause.
// kv_alloc_fail_prob: a KV block allocation the pool could satisfy is refused instead, so the
// scheduler takes its out-of-blocks paths (the head of the queue waits, a running sequence is
// preempted, a remote-prefill reservation is deferred). Nothing else changes: outputs stay exact.
// Each check is one branch on a null pointer when faults are off.

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/engine/sampler/rng.h"

namespace tandem {

struct EngineFaultOptions {
  int64_t stall_ms = 0;        // engine_stall_ms; 0: no stalls
  double stall_prob = 1;       // engine_stall_prob: per step with work
  double alloc_fail_prob = 0;  // kv_alloc_fail_prob: per block allocation
  uint64_t seed = 0;           // 0: random
  int64_t max_faults = 0;      // stop injecting after this many; 0: unlimited

  bool stalls() const { return stall_ms > 0 && stall_prob > 0; }
  bool enabled() const { return stalls() || alloc_fail_prob > 0; }
};

// Parses TANDEM_FAULTS syntax ("key=value,..."). Keys: engine_stall_ms, engine_stall_prob,
// kv_alloc_fail_prob, seed, max_faults; kvtransfer's keys (kv_corrupt, kv_drop, kv_close,
// kv_delay, kv_delay_ms) are skipped. Other keys and bad values are INVALID_ARGUMENT.
absl::StatusOr<EngineFaultOptions> ParseEngineFaultOptions(absl::string_view spec);

// `options` when enabled; else TANDEM_FAULTS if `from_env` and it is set (a malformed value is
// logged and ignored); else disabled.
EngineFaultOptions ResolveEngineFaultOptions(const EngineFaultOptions& options, bool from_env);

std::string EngineFaultOptionsDebugString(const EngineFaultOptions& options);

// Seeded decisions; thread-safe (the engine thread is the only caller in practice).
class EngineFaultInjector {
 public:
  explicit EngineFaultInjector(const EngineFaultOptions& options);

  const EngineFaultOptions& options() const { return options_; }
  // How long the next step with work stalls (zero: not at all).
  absl::Duration NextStall();
  // Whether the next block allocation fails.
  bool FailAllocation();
  int64_t injected() const;

 private:
  bool Draw(double probability);  // under mu_

  const EngineFaultOptions options_;
  mutable std::mutex mu_;
  Rng rng_;
  int64_t injected_ = 0;
  int64_t stalls_ = 0;
  int64_t alloc_failures_ = 0;
};

}  // namespace tandem
