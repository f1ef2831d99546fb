#pragma once

// Fault injection for KV transfers: compiled in, off by default. Enabled by the
// transports' options or by the TANDEM_FAULTS environment variable, e.g.
//   TANDEM_FAULTS="kv_corrupt=0.01,kv_drop=0.01,kv_delay_ms=50,seed=1"
// Each DATA message independently may be delayed, dropped, corrupted (one payload byte flipped
// on the wire, never in the KV pool) or have its connection closed. A corrupted message is
// detected by its checksum and reported as DATA_LOSS; a dropped one by the receiver's
// completeness check at FINISH.

#include <cstdint>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {

struct FaultOptions {
  double kv_corrupt = 0;    // probability a DATA message gets one payload byte flipped
  double kv_drop = 0;       // probability a DATA message is not sent at all
  double kv_close = 0;      // probability the connection is closed before a DATA message
  double kv_delay = 1;      // probability a DATA message is delayed by kv_delay_ms
  int64_t kv_delay_ms = 0;  // 0: no delays
  // nccl and cuda-ipc only (their data paths have no per-message faults): the probability a
  // control message other than CONNECT is lost before it reaches the receiver, and the
  // probability a DATA message's regions land one block off (nccl: the receiver puts them there;
  // cuda-ipc: the sender copies them there) -- a deliberately broken transport, so that the
  // end-to-end tests can show their checks catch a lost message and a misplaced transfer.
  double kv_control_drop = 0;
  double kv_misplace = 0;
  uint64_t seed = 0;       // 0: random
  int64_t max_faults = 0;  // stop injecting after this many faults; 0: unlimited

  bool enabled() const {
    return kv_corrupt > 0 || kv_drop > 0 || kv_close > 0 || (kv_delay > 0 && kv_delay_ms > 0) ||
           kv_control_drop > 0 || kv_misplace > 0;
  }
};

// Parses "key=value,key=value". Keys: kv_corrupt, kv_drop, kv_close, kv_delay, kv_delay_ms,
// kv_control_drop, kv_misplace, seed, max_faults; the engine's keys (engine_stall_ms,
// engine_stall_prob, kv_alloc_fail_prob: common/engine/engine_faults.h) are skipped. Unknown keys
// and bad values are INVALID_ARGUMENT.
absl::StatusOr<FaultOptions> ParseFaultOptions(absl::string_view spec);

// `options` when enabled; else TANDEM_FAULTS if `from_env` and it is set (a malformed value is
// logged and ignored); else disabled.
FaultOptions ResolveFaultOptions(const FaultOptions& options, bool from_env);

std::string FaultOptionsDebugString(const FaultOptions& options);

// Thread-safe, seeded decisions for one transport endpoint.
class FaultInjector {
 public:
  struct Decision {
    absl::Duration delay = absl::ZeroDuration();
    bool drop = false;
    bool corrupt = false;
    bool close = false;
    uint64_t corrupt_position = 0;  // reduce modulo the payload size
    bool any() const { return drop || corrupt || close || delay > absl::ZeroDuration(); }
  };

  explicit FaultInjector(const FaultOptions& options);

  bool enabled() const { return enabled_; }
  // The faults for the next DATA message. Cheap and lock-free when disabled.
  Decision Next();
  // True with probability p (counted as a fault; none once max_faults were injected).
  bool Chance(double p);
  uint64_t injected() const;

 private:
  const FaultOptions options_;
  const bool enabled_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  uint64_t injected_ = 0;
};

}  // namespace tandem::kvtransfer
