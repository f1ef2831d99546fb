#pragma once

// Small accessors for optional tokenizer.json fields. They may throw nlohmann::json
// exceptions on wrong types; Tokenizer::FromFile catches those at the parse boundary.
#include <string>

#include "nlohmann/json.hpp"

namespace tandem::json_util {

inline bool Has(const nlohmann::json& json, const char* key) {
  return json.is_object() && json.contains(key) && !json.at(key).is_null();
}

inline bool GetBool(const nlohmann::json& json, const char* key, bool fallback) {
  return Has(json, key) ? json.at(key).get<bool>() : fallback;
}

inline std::string GetString(const nlohmann::json& json, const char* key,
                             const std::string& fallback) {
  return Has(json, key) ? json.at(key).get<std::string>() : fallback;
}

inline std::string TypeOf(const nlohmann::json& json) {
  return json.is_object() ? GetString(json, "type", "") : "";
}

}  // namespace tandem::json_util
