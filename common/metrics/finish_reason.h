#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace tandem {

// The bounded set of `finish_reason` label values. Anything else is reported as "error".
inline constexpr std::array<const char*, 4> kFinishReasons = {"stop", "length", "abort", "error"};

inline size_t FinishReasonIndex(std::string_view reason) {
  for (size_t i = 0; i < kFinishReasons.size(); ++i) {
    if (reason == kFinishReasons[i]) return i;
  }
  return kFinishReasons.size() - 1;
}

}  // namespace tandem
