#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;

// A Hugging Face `tokenizer.json` tokenizer (BPE model) that gives the same ids and text as
// the Rust `tokenizers` library. See README.md in this folder for what is covered.
//
// Thread-safety: immutable after loading; every const method may be called concurrently
// from any number of threads on one Tokenizer.
class Tokenizer {
 public:
  // Loads a tokenizer.json file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& tokenizer_json_path);
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json (BOS/EOS token
  // names, add_bos_token, chat_template).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);
  // Builds from tokenizer.json text; `origin` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonText(std::string_view json,
                                                                 const std::string& origin);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // HF encode(text, add_special_tokens). With parse_special_tokens = false, special-token
  // text is tokenized as plain text (HF split_special_tokens); non-special added tokens are
  // still matched. Invalid UTF-8 gives InvalidArgumentError.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens,
                                              bool parse_special_tokens = true) const;

  // HF decode(ids, skip_special_tokens). Ids outside [0, vocab_size()) give
  // InvalidArgumentError; ids inside the range without a token (holes) are skipped, like HF.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  // One past the largest id of the vocab including added tokens.
  int32_t vocab_size() const { return vocab_size_; }
  // From tokenizer_config.json (FromModelDir) when it names the tokens.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // tokenizer_config.json add_bos_token when present. Informational: Encode adds what the
  // tokenizer.json post-processor says.
  std::optional<bool> add_bos_token() const { return add_bos_token_; }
  // tokenizer_config.json chat_template (a Jinja template) or empty.
  const std::string& chat_template() const { return chat_template_; }

  // True for added tokens marked special (skipped by Decode(..., true)).
  bool IsSpecial(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The vocab string of `id` (e.g. "Ġworld"); empty when there is none.
  std::string_view IdToToken(int32_t id) const;

 private:
  Tokenizer();
  absl::Status LoadConfig(const std::string& path);
  void EncodePiece(std::string_view text, bool at_start, bool parse_special,
                   std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocabulary> added_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<bool> add_bos_token_;
  std::string chat_template_;
};

}  // namespace tandem
