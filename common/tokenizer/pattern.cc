#include "common/tokenizer/pattern.h"

#include "absl/status/status.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {

absl::StatusOr<Pattern> Pattern::FromJson(const nlohmann::json& json) {
  if (json.is_object() && json.contains("String")) {
    return FromLiteral(json.at("String").get<std::string>());
  }
  if (json.is_object() && json.contains("Regex")) {
    return FromRegex(json.at("Regex").get<std::string>());
  }
  if (json.is_string()) return FromLiteral(json.get<std::string>());
  return absl::InvalidArgumentError("pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<Pattern> Pattern::FromRegex(std::string_view regex) {
  Pattern pattern;
  TANDEM_ASSIGN_OR_RETURN(pattern.regex_, Regex::Compile(regex));
  return pattern;
}

Pattern Pattern::FromLiteral(std::string literal) {
  Pattern pattern;
  pattern.literal_ = std::move(literal);
  return pattern;
}

std::vector<PatternPiece> Pattern::FindMatches(std::string_view text) const {
  std::vector<PatternPiece> pieces;
  if (text.empty()) {
    pieces.push_back({0, 0, false});
    return pieces;
  }
  size_t prev = 0;
  const auto add_match = [&](size_t begin, size_t end) {
    if (prev != begin) pieces.push_back({prev, begin, false});
    pieces.push_back({begin, end, true});
    prev = end;
  };
  if (regex_ != nullptr) {
    for (const auto& [begin, end] : regex_->FindAll(text)) add_match(begin, end);
  } else if (!literal_.empty()) {
    size_t pos = text.find(literal_);
    while (pos != std::string_view::npos) {
      add_match(pos, pos + literal_.size());
      pos = text.find(literal_, pos + literal_.size());
    }
  }
  if (prev != text.size()) pieces.push_back({prev, text.size(), false});
  return pieces;
}

std::string Pattern::ReplaceAll(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  for (const PatternPiece& piece : FindMatches(text)) {
    if (piece.is_match) {
      out.append(content);
    } else {
      out.append(text.substr(piece.begin, piece.end - piece.begin));
    }
  }
  return out;
}

}  // namespace tandem
