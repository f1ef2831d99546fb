#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

// A request body's field that is not acceptable: INVALID_ARGUMENT naming the field (HTTP 400 with
// an OpenAI error body, openai_response.h).
inline absl::Status InvalidField(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

}  // namespace tandem
