#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Incremental detokenization, exactly like the Rust library's DecodeStream (no prefill):
// Step(id) returns the text that id completes, or nullopt while more ids are needed (the
// window's text would end in an incomplete character, U+FFFD, or did not grow). Chunks never
// contain partial UTF-8. Not thread-safe (one per sequence); `tokenizer` must outlive it.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Like Step but reports decode errors (bad ids) instead of returning nullopt.
  absl::StatusOr<std::optional<std::string>> StepOrError(int32_t id);
  std::optional<std::string> Step(int32_t id);

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace tandem
