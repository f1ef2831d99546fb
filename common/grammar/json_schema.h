#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/compile_budget.h"

namespace tandem::grammar {

struct JsonSchemaOptions {
  int32_t max_depth = 64;    // nesting of subschemas walked
  int32_t max_enum = 10000;  // enum/const alternatives in all
  // Subschemas compiled in all (anyOf/oneOf distributed over sibling keywords and allOf merges
  // can multiply them).
  int32_t max_subschemas = 20000;
  // Unsupported validation keywords: refused (INVALID_ARGUMENT) when strict, ignored otherwise
  // (then the output follows the supported keywords only).
  bool strict = true;
  // Composition: rules are named `prefix`root, `prefix`s0, ... and the shared json-* rules are
  // left out (include them once with JsonBaseRules()).
  std::string prefix;
  bool include_base_rules = true;
  // Checked once per subschema (not owned; null: unlimited).
  CompileBudget* budget = nullptr;
};

// The json-* rules (json-value, json-string, ...) every compiled schema refers to.
std::string JsonBaseRules();

// Compiles a JSON Schema (text) into the grammar text form whose `root` matches exactly the
// compact JSON documents (no whitespace) the schema accepts, within the subset README.md
// documents. Unsupported keywords and malformed schemas are INVALID_ARGUMENT naming the JSON
// pointer of the offending subschema.
absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema,
                                                const JsonSchemaOptions& options = {});

// The grammar of any JSON value (root) / any JSON object (root), compact.
std::string AnyJsonGrammar(bool object_only);

}  // namespace tandem::grammar
