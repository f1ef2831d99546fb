#include "kvtransfer/faults.h"

#include "absl/strings/str_cat.h"
#include "common/base/fault_spec.h"
#include "common/base/log.h"

namespace tandem::kvtransfer {

absl::StatusOr<FaultOptions> ParseFaultOptions(absl::string_view spec) {
  FaultOptions o;
  absl::Status s = FaultSpecParser(&o.seed, &o.max_faults)
                       .Probability("kv_corrupt", &o.kv_corrupt)
                       .Probability("kv_drop", &o.kv_drop)
                       .Probability("kv_close", &o.kv_close)
                       .Probability("kv_delay", &o.kv_delay)
                       .Count("kv_delay_ms", &o.kv_delay_ms)
                       .Probability("kv_control_drop", &o.kv_control_drop)
                       .Probability("kv_misplace", &o.kv_misplace)
                       // the engine's keys (common/engine/engine_faults.h)
                       .Skip("engine_stall_ms")
                       .Skip("engine_stall_prob")
                       .Skip("kv_alloc_fail_prob")
                       .Parse(spec);
  if (!s.ok()) return s;
  return o;
}

FaultOptions ResolveFaultOptions(const FaultOptions& options, bool from_env) {
  if (options.enabled() || !from_env) return options;
  const std::string env = FaultSpecParser::FromEnv();
  if (env.empty()) return options;
  absl::StatusOr<FaultOptions> parsed = ParseFaultOptions(env);
  if (!parsed.ok()) {
    TLOG(ERROR) << "ignoring TANDEM_FAULTS: " << parsed.status().message();
    return options;
  }
  if (!parsed->enabled()) return options;
  TLOG(WARNING) << "kv transfer fault injection enabled: " << FaultOptionsDebugString(*parsed);
  return *parsed;
}

std::string FaultOptionsDebugString(const FaultOptions& o) {
  return absl::StrCat("kv_corrupt=", o.kv_corrupt, ",kv_drop=", o.kv_drop, ",kv_close=", o.kv_close,
                      ",kv_delay=", o.kv_delay, ",kv_delay_ms=", o.kv_delay_ms,
                      ",kv_control_drop=", o.kv_control_drop, ",kv_misplace=", o.kv_misplace,
                      ",seed=", o.seed, ",max_faults=", o.max_faults);
}

FaultInjector::FaultInjector(const FaultOptions& options)
    : options_(options),
      enabled_(options.enabled()),
      rng_(options.seed != 0 ? options.seed : std::random_device{}()) {}

FaultInjector::Decision FaultInjector::Next() {
  Decision d;
  if (!enabled_) return d;
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.max_faults > 0 && injected_ >= static_cast<uint64_t>(options_.max_faults)) return d;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  // Draw every probability each time so a seed gives the same sequence whatever fires.
  const double close = uniform(rng_), drop = uniform(rng_), corrupt = uniform(rng_),
               delay = uniform(rng_);
  d.corrupt_position = rng_();
  if (close < options_.kv_close) {
    d.close = true;
  } else if (drop < options_.kv_drop) {
    d.drop = true;
  } else if (corrupt < options_.kv_corrupt) {
    d.corrupt = true;
  }
  if (delay < options_.kv_delay && options_.kv_delay_ms > 0) {
    d.delay = absl::Milliseconds(options_.kv_delay_ms);
  }
  if (d.any()) ++injected_;
  return d;
}

bool FaultInjector::Chance(double p) {
  if (!enabled_ || p <= 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.max_faults > 0 && injected_ >= static_cast<uint64_t>(options_.max_faults)) {
    return false;
  }
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) >= p) return false;
  ++injected_;
  return true;
}

uint64_t FaultInjector::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

}  // namespace tandem::kvtransfer
