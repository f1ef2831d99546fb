#pragma once

// allOf for the JSON Schema front end: the subschemas are merged into one schema that accepts
// exactly the documents all of them accept (or a subset, never more), keyword by keyword:
// properties are merged per key (a key one part leaves to its additionalProperties gets that
// schema too), required and the lower bounds take the union / maximum, upper bounds the minimum,
// types and enums intersect, items merge as allOf. A keyword two parts give differently where
// no exact merge exists (two patterns, two prefixItems) is INVALID_ARGUMENT naming it.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {

// `parts`: schemas without allOf at their top (flattened by the caller) and without $ref (already
// resolved). `where` names the location in errors.
absl::StatusOr<nlohmann::ordered_json> MergeSchemas(
    const std::vector<nlohmann::ordered_json>& parts, const std::string& where);

}  // namespace tandem::grammar
