#include "common/engine/engine_faults.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/fault_spec.h"
#include "common/base/log.h"

namespace tandem {

absl::StatusOr<EngineFaultOptions> ParseEngineFaultOptions(absl::string_view spec) {
  EngineFaultOptions o;
  absl::Status s = FaultSpecParser(&o.seed, &o.max_faults)
                       .Count("engine_stall_ms", &o.stall_ms)
                       .Probability("engine_stall_prob", &o.stall_prob)
                       .Probability("kv_alloc_fail_prob", &o.alloc_fail_prob)
                       // kvtransfer's keys (kvtransfer/faults.h)
                       .Skip("kv_corrupt")
                       .Skip("kv_drop")
                       .Skip("kv_close")
                       .Skip("kv_delay")
                       .Skip("kv_delay_ms")
                       .Skip("kv_control_drop")
                       .Skip("kv_misplace")
                       .Parse(spec);
  if (!s.ok()) return s;
  return o;
}

EngineFaultOptions ResolveEngineFaultOptions(const EngineFaultOptions& options, bool from_env) {
  if (options.enabled() || !from_env) return options;
  const std::string env = FaultSpecParser::FromEnv();
  if (env.empty()) return options;
  absl::StatusOr<EngineFaultOptions> parsed = ParseEngineFaultOptions(env);
  if (!parsed.ok()) {
    TLOG(ERROR) << "ignoring TANDEM_FAULTS for the engine: " << parsed.status().message();
    return options;
  }
  if (!parsed->enabled()) return options;
  TLOG(WARNING) << "engine fault injection enabled: " << EngineFaultOptionsDebugString(*parsed);
  return *parsed;
}

std::string EngineFaultOptionsDebugString(const EngineFaultOptions& o) {
  return absl::StrCat("engine_stall_ms=", o.stall_ms, ",engine_stall_prob=", o.stall_prob,
                      ",kv_alloc_fail_prob=", o.alloc_fail_prob, ",seed=", o.seed,
                      ",max_faults=", o.max_faults);
}

EngineFaultInjector::EngineFaultInjector(const EngineFaultOptions& options)
    : options_(options), rng_(options.seed != 0 ? options.seed : std::random_device{}()) {}

bool EngineFaultInjector::Draw(double probability) {
  if (options_.max_faults > 0 && injected_ >= options_.max_faults) return false;
  if (rng_.Uniform() >= probability) return false;
  ++injected_;
  return true;
}

absl::Duration EngineFaultInjector::NextStall() {
  if (!options_.stalls()) return absl::ZeroDuration();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Draw(options_.stall_prob)) return absl::ZeroDuration();
    if (++stalls_ == 1 || stalls_ % 100 == 0) {
      TLOG(WARNING) << "fault injection: engine step stalled " << options_.stall_ms << " ms ("
                    << stalls_ << " so far)";
    }
  }
  return absl::Milliseconds(options_.stall_ms);
}

bool EngineFaultInjector::FailAllocation() {
  if (options_.alloc_fail_prob <= 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!Draw(options_.alloc_fail_prob)) return false;
  if (++alloc_failures_ == 1 || alloc_failures_ % 100 == 0) {
    TLOG(WARNING) << "fault injection: KV block allocation refused (" << alloc_failures_
                  << " so far)";
  }
  return true;
}

int64_t EngineFaultInjector::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

}  // namespace tandem
