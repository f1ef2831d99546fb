#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem {

// Debian's abseil has its own string_view type (not std::string_view's alias): the view of the
// same characters, for absl's string functions.
inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace tandem
