#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::grammar {

// The error of every part of the JSON Schema front end: the schema path and what is wrong there.
inline absl::Status SchemaError(const std::string& where, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("json_schema: at ", where, ": ", std::string(what)));
}

}  // namespace tandem::grammar
