#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::grammar {

// Each token's decoded bytes and a byte trie over them, built once per tokenizer. Tokens with no
// bytes (special and control tokens) are never allowed by a grammar; end-of-sequence tokens are
// handled by the engine. Immutable, shared by every compiled grammar of one model.
class TokenVocab {
 public:
  struct Node {
    int32_t child_begin = 0;  // into child_bytes / child_nodes
    int32_t child_end = 0;
    int32_t token_begin = 0;  // into node_tokens: tokens whose bytes end here
    int32_t token_end = 0;
  };

  // `bytes[id]` is token id's byte string ("" for tokens a grammar never allows).
  static std::shared_ptr<const TokenVocab> FromBytes(std::vector<std::string> bytes);
  // Byte-level BPE (GPT-2 byte map) or SentencePiece with byte fallback (`<0xHH>`, U+2581 as
  // space), detected from the vocabulary.
  static absl::StatusOr<std::shared_ptr<const TokenVocab>> FromTokenizer(const Tokenizer& tok);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  // Trie: node 0 is the root (the empty prefix).
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<uint8_t>& child_bytes() const { return child_bytes_; }
  const std::vector<int32_t>& child_nodes() const { return child_nodes_; }
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  // Subtree of `node` (nodes are in preorder): its tokens are node_tokens()[token_begin,
  // subtree_token_end) and every edge byte below it is in subtree_bytes.
  int32_t subtree_token_end(int32_t node) const { return subtree_token_end_[node]; }
  const std::bitset<256>& subtree_bytes(int32_t node) const { return subtree_bytes_[node]; }

 private:
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<uint8_t> child_bytes_;
  std::vector<int32_t> child_nodes_;
  std::vector<int32_t> node_tokens_;
  std::vector<int32_t> subtree_token_end_;
  std::vector<std::bitset<256>> subtree_bytes_;
};

}  // namespace tandem::grammar
