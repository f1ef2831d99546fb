#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// A tokenizer.json `post_processor`, applied to a single sequence when special tokens are
// requested (e.g. prepends BOS). Immutable and thread-safe once built.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void AddSpecialTokens(std::vector<int32_t>* ids) const = 0;
};

// Builds the post-processor described by `json` (non-null). Supported types: Sequence,
// TemplateProcessing (single-sequence template), ByteLevel (no id change), BertProcessing,
// RobertaProcessing. Others give UnimplementedError.
// Malformed fields may throw nlohmann::json exceptions; Tokenizer::FromJsonText catches them.
absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const nlohmann::json& json);

}  // namespace tandem
