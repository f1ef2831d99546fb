#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// One piece of a text cut by a Pattern: [begin, end) and whether it is a match.
struct PatternPiece {
  size_t begin;
  size_t end;
  bool is_match;
};

// Hugging Face's `pattern` field: {"String": "..."} (literal) or {"Regex": "..."}.
// Immutable after construction; safe to use from many threads.
class Pattern {
 public:
  static absl::StatusOr<Pattern> FromJson(const nlohmann::json& json);
  static absl::StatusOr<Pattern> FromRegex(std::string_view regex);
  static Pattern FromLiteral(std::string literal);

  // Pieces that cover `text` in order, like HF's Pattern::find_matches: an empty text gives
  // one empty non-match; an empty literal matches nothing; regex matches may be empty.
  std::vector<PatternPiece> FindMatches(std::string_view text) const;

  // Every match replaced by `content`.
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null for a literal pattern
};

}  // namespace tandem
