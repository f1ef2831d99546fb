#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

// Small typed accessors over nlohmann::json that never throw: every error is an absl::Status
// whose message names `source` (a file path) and the field.

// Parses a JSON document. Errors: InvalidArgument naming `source` and the parser's position.
absl::StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, const std::string& source);

// The value of obj[key] when present and not null; nullopt when absent or null. A value of the
// wrong type (or an integer field holding a fraction) is an InvalidArgument error.
absl::StatusOr<std::optional<int64_t>> JsonOptionalInt(const nlohmann::json& obj,
                                                       const std::string& key,
                                                       const std::string& source);
absl::StatusOr<std::optional<double>> JsonOptionalDouble(const nlohmann::json& obj,
                                                         const std::string& key,
                                                         const std::string& source);
absl::StatusOr<std::optional<bool>> JsonOptionalBool(const nlohmann::json& obj,
                                                     const std::string& key,
                                                     const std::string& source);
absl::StatusOr<std::optional<std::string>> JsonOptionalString(const nlohmann::json& obj,
                                                              const std::string& key,
                                                              const std::string& source);

// Like JsonOptionalInt, but absence is an InvalidArgument error naming the field.
absl::StatusOr<int64_t> JsonRequiredInt(const nlohmann::json& obj, const std::string& key,
                                        const std::string& source);

// Converts a JSON number to int64 if it holds an integral value in range (5 and 5.0 both do).
std::optional<int64_t> JsonToInt(const nlohmann::json& value);

}  // namespace tandem
