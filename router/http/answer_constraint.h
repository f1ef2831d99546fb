#pragma once

// Structured output on the answer part only: with a reasoning parser, a request's output
// constraint (response_format, guided_*, a forced tool choice) becomes a grammar that lets the
// model's reasoning block come first, free, and constrains what follows the close tag (vLLM's
// default; --structured-outputs-enable-in-reasoning constrains the whole output instead).

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/http/reasoning_parser.h"
#include "tandem/v1/sampling.pb.h"

namespace tandem {

// Rewrites a set `constraint` (json_schema, json_object, regex, grammar or choice) into one
// grammar: [the reasoning block, when the output starts in it or may open it] [whitespace]
// [the original constraint]. Unchanged without reasoning (kAnswer) or without a constraint.
// INVALID_ARGUMENT (the constraint's own error, naming its location) when it does not compile
// to the grammar text form.
absl::Status ConstrainAnswerOnly(ReasoningParser parser, ReasoningStart start,
                                 v1::OutputConstraint* constraint);

// Grammar rules (text form) for `name`: any text without `tag`, then `tag` (the reasoning
// block's body and its close tag). `tag`'s first character must not recur in it.
absl::StatusOr<std::string> TextUntilTagGrammar(std::string_view name, std::string_view tag);

// A user grammar with every rule name prefixed by `prefix` (so it composes with other rules).
std::string PrefixGrammarRules(std::string_view grammar, std::string_view prefix);

}  // namespace tandem
