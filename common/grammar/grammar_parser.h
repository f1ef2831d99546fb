#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

// Parses the GBNF-style text form (README.md) into a Grammar whose start rule is `root`.
// Syntax errors are INVALID_ARGUMENT naming line and column.
absl::StatusOr<Grammar> ParseGrammar(std::string_view text, const GrammarLimits& limits = {});

}  // namespace tandem::grammar
