#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/compile_budget.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

// Parses the GBNF-style text form (README.md) into a Grammar whose start rule is `root`.
// Syntax errors are INVALID_ARGUMENT naming line and column. `budget` (not owned; null:
// unlimited) is checked per term and per rule analysed; past it the parse gives up with its
// status.
absl::StatusOr<Grammar> ParseGrammar(std::string_view text, const GrammarLimits& limits = {},
                                     CompileBudget* budget = nullptr);

}  // namespace tandem::grammar
