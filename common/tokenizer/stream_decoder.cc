#include "common/tokenizer/stream_decoder.h"

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
  size_t emitted = prefix_.size();
  if (!absl::StartsWith(text, prefix_)) {
    // A byte-fallback token can change how the bytes before it decode (HF ByteFallback turns a
    // run of byte tokens that is not valid UTF-8 into one U+FFFD per byte), so the window no
    // longer starts with the text already sent. That text cannot be taken back: go on from the
    // longest common prefix (cut at a character boundary) instead of failing the rest of the
    // stream (a case tokenizer_fuzzer found).
    size_t common = 0;
    while (common < prefix_.size() && prefix_[common] == text[common]) ++common;
    while (common > 0 && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
    emitted = common;
  }
  std::string chunk = text.substr(emitted);
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
