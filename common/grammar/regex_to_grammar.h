#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::grammar {

// Translates a regular expression (README.md lists the syntax) into a grammar expression in the
// text form; the whole output must match (leading ^ and trailing $ are accepted and implied).
// json_string: the expression describes a JSON string's decoded content, so the result produces
// the escaped form (`"` and `\` as escapes; control characters never). Lookaround and
// backreferences are INVALID_ARGUMENT naming the offset.
absl::StatusOr<std::string> RegexToGrammarExpr(std::string_view regex, bool json_string = false);

// Encodes `cp` for use inside a grammar string literal or character class (\uXXXX style when not
// printable ASCII or when special).
std::string EscapeCodePoint(uint32_t cp);
// A grammar string literal "..." for `text` (UTF-8).
std::string GrammarLiteral(std::string_view text);

}  // namespace tandem::grammar
