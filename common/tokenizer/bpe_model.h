#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer_json.h"

namespace tandem {

// The BPE `model` of a tokenizer.json: vocab, ranked merges and the word-level options
// (byte_fallback, unk_token/fuse_unk, ignore_merges, continuing_subword_prefix,
// end_of_word_suffix). Immutable after loading; Tokenize is safe from many threads.
class BpeModel {
 public:
  // `model` is the tokenizer.json `model` object (type "BPE" or absent) for the options;
  // vocab and merges come from `data` (see ParseTokenizerJson).
  // Malformed fields may throw nlohmann::json exceptions; Tokenizer::FromJsonText catches them.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const nlohmann::json& model,
                                                          BpeVocabData data);

  // Appends the ids of one pre-token (HF BPE::tokenize without dropout).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The vocab string of `id`, or nullopt when the model has no such id.
  std::optional<std::string_view> IdToToken(int32_t id) const;

  int32_t size() const { return static_cast<int32_t>(vocab_.size()); }
  // One past the largest id in the vocab.
  int32_t id_limit() const { return static_cast<int32_t>(entries_.size()); }

 private:
  struct Entry {
    uint32_t offset = 0;
    int32_t length = -1;  // -1: no token has this id
  };
  struct MergeResult {
    int32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t length;  // bytes of the word covered; 0 once merged into its left neighbour
  };

  BpeModel() = default;
  std::optional<int32_t> Lookup(absl::string_view token) const;
  void MergeWord(std::vector<Symbol>* symbols) const;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::string pool_;                                       // all token strings back to back
  std::vector<Entry> entries_;                             // by id
  absl::flat_hash_map<absl::string_view, int32_t> vocab_;  // views into pool_
  absl::flat_hash_map<uint64_t, MergeResult> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xXX>" or -1
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
};

}  // namespace tandem
