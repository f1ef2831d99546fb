#include "common/config/json_fields.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::Status TypeError(const std::string& source, const std::string& key, const char* expected,
                       const nlohmann::json& value) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", key, "' must be ", expected,
                                                 ", got ", value.type_name(), " ",
                                                 value.dump().substr(0, 64)));
}

const nlohmann::json* Find(const nlohmann::json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
}

std::optional<int64_t> JsonToInt(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    double d = value.get<double>();
    // 2^63 is exactly representable; anything at or beyond it does not fit.
    if (!std::isfinite(d) || d != std::floor(d) || d >= 9223372036854775808.0 ||
        d < -9223372036854775808.0) {
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<int64_t>> JsonOptionalInt(const nlohmann::json& obj,
                                                       const std::string& key,
                                                       const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = JsonToInt(*v);
  if (!i.has_value()) return TypeError(source, key, "an integer", *v);
  return i;
}

absl::StatusOr<std::optional<double>> JsonOptionalDouble(const nlohmann::json& obj,
                                                         const std::string& key,
                                                         const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return TypeError(source, key, "a number", *v);
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<bool>> JsonOptionalBool(const nlohmann::json& obj,
                                                     const std::string& key,
                                                     const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return TypeError(source, key, "a boolean", *v);
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> JsonOptionalString(const nlohmann::json& obj,
                                                              const std::string& key,
                                                              const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(source, key, "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<int64_t> JsonRequiredInt(const nlohmann::json& obj, const std::string& key,
                                        const std::string& source) {
  absl::StatusOr<std::optional<int64_t>> v = JsonOptionalInt(obj, key, source);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": required field '", key, "' is missing"));
  }
  return **v;
}

}  // namespace tandem
