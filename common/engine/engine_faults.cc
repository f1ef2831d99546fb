#include "common/engine/engine_faults.h"

#include <cstdlib>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/log.h"

namespace tandem {
namespace {

absl::Status ParseProbability(absl::string_view key, absl::string_view value, double* out) {
  double v;
  if (!absl::SimpleAtod(value, &v) || !(v >= 0 && v <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault option ", key, ": '", value, "' is not a probability in [0, 1]"));
  }
  *out = v;
  return absl::OkStatus();
}

bool IsTransferKey(absl::string_view key) {
  return key == "kv_corrupt" || key == "kv_drop" || key == "kv_close" || key == "kv_delay" ||
         key == "kv_delay_ms";
}

}  // namespace

absl::StatusOr<EngineFaultOptions> ParseEngineFaultOptions(absl::string_view spec) {
  EngineFaultOptions o;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("fault option '", item, "' is not key=value"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(kv[0]);
    const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
    absl::Status s;
    if (key == "engine_stall_ms") {
      if (!absl::SimpleAtoi(value, &o.stall_ms) || o.stall_ms < 0) {
        s = absl::InvalidArgumentError(
            absl::StrCat("fault option engine_stall_ms: bad value '", value, "'"));
      }
    } else if (key == "engine_stall_prob") {
      s = ParseProbability(key, value, &o.stall_prob);
    } else if (key == "kv_alloc_fail_prob") {
      s = ParseProbability(key, value, &o.alloc_fail_prob);
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(value, &o.seed)) {
        s = absl::InvalidArgumentError(absl::StrCat("fault option seed: bad value '", value, "'"));
      }
    } else if (key == "max_faults") {
      if (!absl::SimpleAtoi(value, &o.max_faults) || o.max_faults < 0) {
        s = absl::InvalidArgumentError(
            absl::StrCat("fault option max_faults: bad value '", value, "'"));
      }
    } else if (!IsTransferKey(key)) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "unknown fault option '", key,
          "' (known: engine_stall_ms, engine_stall_prob, kv_alloc_fail_prob, kv_corrupt, "
          "kv_drop, kv_close, kv_delay, kv_delay_ms, seed, max_faults)"));
    }
    if (!s.ok()) return s;
  }
  return o;
}

EngineFaultOptions ResolveEngineFaultOptions(const EngineFaultOptions& options, bool from_env) {
  if (options.enabled() || !from_env) return options;
  const char* env = std::getenv("TANDEM_FAULTS");
  if (env == nullptr || *env == '\0') return options;
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
