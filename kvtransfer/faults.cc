#include "kvtransfer/faults.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/log.h"

namespace tandem::kvtransfer {
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

}  // namespace

absl::StatusOr<FaultOptions> ParseFaultOptions(absl::string_view spec) {
  FaultOptions o;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("fault option '", item, "' is not key=value"));
    }
    absl::string_view key = absl::StripAsciiWhitespace(kv[0]);
    absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
    absl::Status s;
    if (key == "kv_corrupt") {
      s = ParseProbability(key, value, &o.kv_corrupt);
    } else if (key == "kv_drop") {
      s = ParseProbability(key, value, &o.kv_drop);
    } else if (key == "kv_close") {
      s = ParseProbability(key, value, &o.kv_close);
    } else if (key == "kv_delay") {
      s = ParseProbability(key, value, &o.kv_delay);
    } else if (key == "kv_delay_ms") {
      if (!absl::SimpleAtoi(value, &o.kv_delay_ms) || o.kv_delay_ms < 0) {
        s = absl::InvalidArgumentError(
            absl::StrCat("fault option kv_delay_ms: bad value '", value, "'"));
      }
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(value, &o.seed)) {
        s = absl::InvalidArgumentError(absl::StrCat("fault option seed: bad value '", value, "'"));
      }
    } else if (key == "max_faults") {
      if (!absl::SimpleAtoi(value, &o.max_faults) || o.max_faults < 0) {
        s = absl::InvalidArgumentError(
            absl::StrCat("fault option max_faults: bad value '", value, "'"));
      }
    } else if (key == "engine_stall_ms" || key == "engine_stall_prob" ||
               key == "kv_alloc_fail_prob") {
      // The engine's faults (common/engine/engine_faults.h) share TANDEM_FAULTS.
    } else {
      s = absl::InvalidArgumentError(absl::StrCat(
          "unknown fault option '", key,
          "' (known: kv_corrupt, kv_drop, kv_close, kv_delay, kv_delay_ms, seed, max_faults; "
          "engine_stall_ms, engine_stall_prob, kv_alloc_fail_prob for the engine)"));
    }
    if (!s.ok()) return s;
  }
  return o;
}

FaultOptions ResolveFaultOptions(const FaultOptions& options, bool from_env) {
  if (options.enabled() || !from_env) return options;
  const char* env = std::getenv("TANDEM_FAULTS");
  if (env == nullptr || *env == '\0') return options;
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
                      ",kv_delay=", o.kv_delay, ",kv_delay_ms=", o.kv_delay_ms, ",seed=", o.seed,
                      ",max_faults=", o.max_faults);
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

uint64_t FaultInjector::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

}  // namespace tandem::kvtransfer
