#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// One pre-token: a piece of normalized text that the model tokenizes on its own.
struct PreToken {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace "first")
};

// A tokenizer.json `pre_tokenizer`: splits (and may rewrite) pre-tokens. Empty pieces are
// dropped. Immutable and thread-safe once built.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// Builds the pre-tokenizer described by `json` (non-null). Supported types: Sequence,
// Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation,
// BertPreTokenizer. Others give UnimplementedError.
// Malformed fields may throw nlohmann::json exceptions; Tokenizer::FromJsonText catches them.
absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& json);

}  // namespace tandem
