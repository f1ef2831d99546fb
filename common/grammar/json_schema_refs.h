#pragma once

// Local references and oneOf disjointness for the JSON Schema front end (json_schema.cc).

#include <string>

#include "nlohmann/json.hpp"

namespace tandem::grammar {

// The subschema a local $ref (`#` or a JSON pointer `#/a/b/0`, with ~0 / ~1 escapes) points to
// within `root`, or null.
const nlohmann::ordered_json* ResolveLocalRef(const nlohmann::ordered_json& root,
                                              const std::string& target);

// Whether no document can match two of the oneOf alternatives `alts` (so oneOf may be compiled
// as anyOf): each has a single distinct type (integer and number overlap), or each lists
// const/enum values and no value repeats, or they are objects told apart by a required tag
// property (a discriminator: {"kind": {"const": "circle"}}) whose values differ. $refs among
// them resolve within `root`.
bool OneOfDisjoint(const nlohmann::ordered_json& root, const nlohmann::ordered_json& alts);

}  // namespace tandem::grammar
