#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"

namespace tandem {

class Normalizer;

// One entry of tokenizer.json `added_tokens`.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;  // match only when not inside a word
  bool lstrip = false;       // also swallow whitespace on the left
  bool rstrip = false;       // ... and on the right
  bool normalized = false;   // matched in normalized text (else in the raw input)
};

// A piece of text cut by the added vocabulary: [begin, end) of the searched text and the
// added token's id, or -1 for ordinary text.
struct AddedSplit {
  size_t begin;
  size_t end;
  int32_t id;
};

// HF AddedVocabulary: finds added tokens in text, leftmost-longest, with the lstrip/rstrip/
// single_word rules. Non-normalized tokens are matched in the raw input, normalized ones in
// each normalized piece. Immutable after Create; safe to use from many threads.
class AddedVocabulary {
 public:
  // `normalizer` (may be null) normalizes the patterns of `normalized` tokens.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(std::vector<AddedToken> tokens,
                                                                 const Normalizer* normalizer);

  // Splits raw input by the non-normalized tokens (`normalized` = false) or a normalized
  // piece by the normalized tokens (`normalized` = true). With match_special = false,
  // special tokens are not recognized (HF split_special_tokens); other tokens still are.
  std::vector<AddedSplit> Split(std::string_view text, bool normalized, bool match_special) const;

  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  bool IsSpecialContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Byte trie of the token strings of one matching set.
  struct Trie {
    struct Node {
      int32_t token = -1;  // index into tokens_ when a pattern ends here
    };
    std::vector<Node> nodes{Node{}};
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    bool first_byte[256] = {};
    void Insert(std::string_view pattern, int32_t token);
    // Index into tokens_ and length of the longest pattern starting at text[pos], if any.
    std::optional<std::pair<int32_t, size_t>> LongestAt(std::string_view text, size_t pos) const;
  };

  AddedVocabulary() = default;
  bool IsWordChar(std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, int32_t> by_id_;           // id -> index into tokens_
  absl::flat_hash_map<std::string, int32_t> by_content_;  // content -> index into tokens_
  absl::flat_hash_set<std::string> special_contents_;
  Trie raw_trie_;
  Trie normalized_trie_;
  std::unique_ptr<Regex> word_char_;  // \w, only when a token is single_word
};

}  // namespace tandem
