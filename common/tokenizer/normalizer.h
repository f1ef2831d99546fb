#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// A tokenizer.json `normalizer`: rewrites one piece of input text (the text between added
// tokens) before pre-tokenization. Immutable and thread-safe once built.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

// Builds the normalizer described by `json` (a non-null tokenizer.json `normalizer` value).
// Supported types: Sequence, Prepend, Replace (String/Regex), NFC, NFD, NFKC, NFKD,
// Lowercase, Strip. Others give UnimplementedError.
// Malformed fields may throw nlohmann::json exceptions; Tokenizer::FromJsonText catches them.
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& json);

}  // namespace tandem
