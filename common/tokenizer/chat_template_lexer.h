#pragma once

// Splits a chat template into text and tags the way Jinja does with Hugging Face's settings
// (trim_blocks and lstrip_blocks on; "-" and "+" whitespace control), and tokenizes the tags.

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template_value.h"

namespace tandem::chat_template {

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp };
  Type type = Type::kName;
  std::string text;  // name, operator, or the decoded string literal
  Json value;        // numbers
};

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;           // kText
  std::vector<Token> tokens;  // kOutput, kStatement
  int line = 1;
};

absl::StatusOr<std::vector<Piece>> LexTemplate(absl::string_view source);

}  // namespace tandem::chat_template
