#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// A compiled Oniguruma regular expression (UTF-8, Oniguruma's default syntax), the engine
// Hugging Face tokenizers use, so \p{L}, (?i:...), lookahead and friends behave the same.
// Compiled once; FindAll is const and safe to call from many threads at once (each call
// uses its own match region).
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of the successive non-overlapping matches in valid UTF-8
  // `text`, like the onig crate's find_iter: each search starts where the previous match
  // ended (with the whole text as context), and an empty match right after the previous
  // match is skipped by advancing one character.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* compiled) : pattern_(std::move(pattern)), regex_(compiled) {}

  std::string pattern_;
  void* regex_;  // regex_t*
};

// Escapes `text` so that it matches literally.
std::string RegexEscape(std::string_view text);

}  // namespace tandem
