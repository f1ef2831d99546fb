#include "common/base/fault_spec.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {

FaultSpecParser::FaultSpecParser(uint64_t* seed, int64_t* max_faults) {
  keys_.push_back({"seed", Kind::kSeed, seed});
  keys_.push_back({"max_faults", Kind::kCount, max_faults});
}

FaultSpecParser& FaultSpecParser::Probability(absl::string_view key, double* out) {
  keys_.push_back({std::string(key), Kind::kProbability, out});
  return *this;
}

FaultSpecParser& FaultSpecParser::Count(absl::string_view key, int64_t* out) {
  keys_.push_back({std::string(key), Kind::kCount, out});
  return *this;
}

FaultSpecParser& FaultSpecParser::Skip(absl::string_view key) {
  keys_.push_back({std::string(key), Kind::kSkip, nullptr});
  return *this;
}

absl::Status FaultSpecParser::Parse(absl::string_view spec) const {
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("fault option '", item, "' is not key=value"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(kv[0]);
    const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
    const Key* found = nullptr;
    for (const Key& k : keys_) {
      if (k.name == key) found = &k;
    }
    if (found == nullptr) {
      std::vector<std::string> names;
      for (const Key& k : keys_) names.push_back(k.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown fault option '", key, "' (known: ", absl::StrJoin(names, ", "), ")"));
    }
    switch (found->kind) {
      case Kind::kProbability: {
        double v;
        if (!absl::SimpleAtod(value, &v) || !(v >= 0 && v <= 1)) {
          return absl::InvalidArgumentError(
              absl::StrCat("fault option ", key, ": '", value, "' is not a probability in [0, 1]"));
        }
        *static_cast<double*>(found->out) = v;
        break;
      }
      case Kind::kCount: {
        int64_t v;
        if (!absl::SimpleAtoi(value, &v) || v < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("fault option ", key, ": bad value '", value, "'"));
        }
        *static_cast<int64_t*>(found->out) = v;
        break;
      }
      case Kind::kSeed:
        if (!absl::SimpleAtoi(value, static_cast<uint64_t*>(found->out))) {
          return absl::InvalidArgumentError(
              absl::StrCat("fault option ", key, ": bad value '", value, "'"));
        }
        break;
      case Kind::kSkip:
        break;
    }
  }
  return absl::OkStatus();
}

std::string FaultSpecParser::FromEnv() {
  const char* env = std::getenv("TANDEM_FAULTS");
  return env == nullptr ? std::string() : std::string(env);
}

}  // namespace tandem
