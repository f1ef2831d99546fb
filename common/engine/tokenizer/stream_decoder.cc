#include "common/engine/tokenizer/stream_decoder.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

bool EndsWithReplacementChar(const std::string& text) {
  return absl::EndsWith(text, "\xEF\xBF\xBD");
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::optional<std::string>> StreamDecoder::StepOrError(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary"));
  }
  if (prefix_.empty() && !ids_.empty()) {
    TANDEM_ASSIGN_OR_RETURN(std::string new_prefix, tokenizer_.Decode(ids_, skip_special_tokens_));
    if (!EndsWithReplacementChar(new_prefix)) {
      prefix_ = std::move(new_prefix);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  TANDEM_ASSIGN_OR_RETURN(std::string text, tokenizer_.Decode(ids_, skip_special_tokens_));
  if (text.size() <= prefix_.size() || EndsWithReplacementChar(text)) return std::nullopt;
  if (!absl::StartsWith(text, prefix_)) {
    return absl::InternalError("stream decode: the window text no longer starts with its prefix");
  }
  std::string chunk = text.substr(prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  TANDEM_ASSIGN_OR_RETURN(prefix_, tokenizer_.Decode(ids_, skip_special_tokens_));
  prefix_index_ = new_prefix_index;
  return std::optional<std::string>(std::move(chunk));
}

std::optional<std::string> StreamDecoder::Step(int32_t id) {
  auto chunk = StepOrError(id);
  if (!chunk.ok()) return std::nullopt;
  return *std::move(chunk);
}

}  // namespace tandem
