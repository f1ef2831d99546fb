#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

// The bulky part of a BPE model, read straight from the JSON text into flat buffers.
struct BpeVocabData {
  struct Piece {
    uint32_t offset;  // into `vocab_strings` or `merge_strings`
    uint32_t length;
  };
  struct VocabEntry {
    Piece token;
    int64_t id;
  };
  struct Merge {
    Piece left;
    Piece right;
  };

  static Piece Add(std::string_view text, std::string* buffer) {
    const Piece piece{static_cast<uint32_t>(buffer->size()), static_cast<uint32_t>(text.size())};
    buffer->append(text);
    return piece;
  }

  bool has_vocab = false;         // model.vocab was a JSON object
  bool has_merges = false;        // model.merges was a JSON array
  std::string vocab_strings;      // every vocab token, back to back
  std::string merge_strings;      // both parts of every merge, back to back
  std::vector<VocabEntry> vocab;  // in file order
  std::vector<Merge> merges;      // in rank order
};

struct ParsedTokenizerJson {
  nlohmann::json json;  // the document, with model.vocab / model.merges replaced by null
  BpeVocabData bpe;
};

// Parses tokenizer.json text in one streaming pass: model.vocab and model.merges (hundreds of
// thousands of entries) go straight into flat vectors instead of a JSON tree, which is what
// makes loading a 150k-token tokenizer fast. Merges may be "a b" strings or ["a", "b"] pairs.
// Errors are InvalidArgument naming `origin`; no exception escapes.
absl::StatusOr<ParsedTokenizerJson> ParseTokenizerJson(std::string_view text,
                                                       const std::string& origin);

}  // namespace tandem
