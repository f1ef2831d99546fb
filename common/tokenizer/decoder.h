#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// A tokenizer.json `decoder`: turns the token strings of ids into text pieces (HF
// decode_chain); the decoded text is the concatenation of the pieces. Immutable and
// thread-safe once built.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Builds the decoder described by `json` (non-null). Supported types: Sequence, Replace,
// ByteFallback, Fuse, Strip, ByteLevel, Metaspace, BPEDecoder. Others give
// UnimplementedError.
// Malformed fields may throw nlohmann::json exceptions; Tokenizer::FromJsonText catches them.
absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& json);

}  // namespace tandem
