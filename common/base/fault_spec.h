#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The TANDEM_FAULTS syntax ("key=value,key=value"), shared by every component that injects
// faults (common/engine/engine_faults.h, kvtransfer/faults.h). Each component declares the keys
// it reads and where their values go, plus the keys other components read (skipped); `seed` and
// `max_faults` are every component's. Parse refuses a malformed item, a bad value or a key no
// component reads with INVALID_ARGUMENT naming it.
class FaultSpecParser {
 public:
  FaultSpecParser(uint64_t* seed, int64_t* max_faults);

  FaultSpecParser& Probability(absl::string_view key, double* out);  // in [0, 1]
  FaultSpecParser& Count(absl::string_view key, int64_t* out);       // >= 0
  FaultSpecParser& Skip(absl::string_view key);                      // another component's key

  absl::Status Parse(absl::string_view spec) const;

  // The value of TANDEM_FAULTS, or "" when unset.
  static std::string FromEnv();

 private:
  enum class Kind { kProbability, kCount, kSeed, kSkip };
  struct Key {
    std::string name;
    Kind kind;
    void* out;
  };
  std::vector<Key> keys_;
};

}  // namespace tandem
