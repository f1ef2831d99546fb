#pragma once

// Parts of the JSON Schema front end (json_schema.cc) that look at schemas without building
// grammar: which keywords only annotate, whether a value satisfies simple keywords, and the
// keywords honoured by narrowing the output to a subset of the valid documents, rewritten into
// the keywords the compiler handles.

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {

// Keywords that only annotate: they never change which documents validate.
const std::set<std::string>& SchemaAnnotations();

// Whether `s` has validation keywords other than `except` (annotations do not count).
bool HasValidationKeywords(const nlohmann::ordered_json& s, std::string_view except);

// Whether the value `v` satisfies the simple keywords of `s` beside enum/const (type, numeric
// and length bounds); nullopt when `s` has another keyword this check does not know.
std::optional<bool> ValueFits(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s);

// if/then/else (documents that satisfy if and then), not of types (the other types),
// dependencies (a dependent property is left out unless required, then its dependencies
// apply), patternProperties and propertyNames (on the declared properties when no other keys
// may appear), rewritten into the other keywords; nullopt when `s` has none of them. Strict:
// the forms that cannot be narrowed are INVALID_ARGUMENT naming `where`; otherwise ignored.
absl::StatusOr<std::optional<nlohmann::ordered_json>> RewriteNarrowing(
    const nlohmann::ordered_json& s, const std::string& where, bool strict);

}  // namespace tandem::grammar
