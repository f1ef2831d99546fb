#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template_ast.h"

namespace tandem::chat_template {

// Parses a Jinja chat template (the subset Hugging Face chat templates use: if/elif/else,
// for ... in ... [if ...] [recursive] with else, set (names, tuples, namespace attributes,
// blocks), macro, call, filter and with blocks, break/continue, generation blocks (raw blocks
// are the lexer's), and expressions with filters, tests, calls with *args/**kwargs, slices,
// list/dict literals and conditional expressions). Nesting is bounded so that no input can
// exhaust the stack.
absl::StatusOr<Body> ParseTemplate(absl::string_view source);

}  // namespace tandem::chat_template
