#include "common/grammar/token_vocab.h"

#include <algorithm>
#include <numeric>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::grammar {
namespace {

// Decodes one UTF-8 code point at `s[*i]`; -1 when invalid.
int64_t NextCodePoint(const std::string& s, size_t* i) {
  unsigned char c = static_cast<unsigned char>(s[*i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || *i + n > s.size()) return -1;
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += n;
  return v;
}

int HexByte(const std::string& s) {
  // "<0xHH>"
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    char c = s[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                   : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

std::shared_ptr<const TokenVocab> TokenVocab::FromBytes(std::vector<std::string> bytes) {
  auto v = std::make_shared<TokenVocab>();
  v->bytes_ = std::move(bytes);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < v->size(); ++i) {
    if (!v->bytes_[i].empty()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return v->bytes_[a] != v->bytes_[b] ? v->bytes_[a] < v->bytes_[b] : a < b;
  });
  // Build the trie from the sorted byte strings: a stack of open nodes along the current path.
  struct Open {
    std::vector<std::pair<uint8_t, int32_t>> children;
    std::vector<int32_t> tokens;
  };
  std::vector<Open> all(1);
  std::vector<int32_t> path = {0};
  std::string prev;
  for (int32_t id : order) {
    const std::string& s = v->bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      const int32_t node = static_cast<int32_t>(all.size());
      all.emplace_back();
      all[path.back()].children.push_back({static_cast<uint8_t>(s[d]), node});
      path.push_back(node);
    }
    all[path.back()].tokens.push_back(id);
    prev = s;
  }
  v->nodes_.resize(all.size());
  for (size_t n = 0; n < all.size(); ++n) {
    Node& node = v->nodes_[n];
    node.child_begin = static_cast<int32_t>(v->child_bytes_.size());
    for (auto [b, c] : all[n].children) {
      v->child_bytes_.push_back(b);
      v->child_nodes_.push_back(c);
    }
    node.child_end = static_cast<int32_t>(v->child_bytes_.size());
    node.token_begin = static_cast<int32_t>(v->node_tokens_.size());
    v->node_tokens_.insert(v->node_tokens_.end(), all[n].tokens.begin(), all[n].tokens.end());
    node.token_end = static_cast<int32_t>(v->node_tokens_.size());
  }
  v->subtree_token_end_.resize(v->nodes_.size());
  v->subtree_bytes_.resize(v->nodes_.size());
  for (size_t n = v->nodes_.size(); n-- > 0;) {
    int32_t end = v->nodes_[n].token_end;
    for (int32_t c = v->nodes_[n].child_begin; c < v->nodes_[n].child_end; ++c) {
      const int32_t child = v->child_nodes_[c];
      end = std::max(end, v->subtree_token_end_[child]);
      v->subtree_bytes_[n] |= v->subtree_bytes_[child];
      v->subtree_bytes_[n].set(v->child_bytes_[c]);
    }
    v->subtree_token_end_[n] = end;
  }
  return v;
}

absl::StatusOr<std::shared_ptr<const TokenVocab>> TokenVocab::FromTokenizer(const Tokenizer& tok) {
  const bool sentencepiece = tok.TokenToId("<0x0A>").has_value();
  std::vector<std::string> bytes(tok.vocab_size());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsSpecial(id)) continue;
    const std::string s(tok.IdToToken(id));
    if (s.empty()) continue;
    std::string out;
    if (sentencepiece) {
      int b = HexByte(s);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        // "▁" (U+2581, E2 96 81) stands for a space.
        for (size_t i = 0; i < s.size(); ++i) {
          if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            out.push_back(' ');
            i += 2;
          } else {
            out.push_back(s[i]);
          }
        }
        // Control pieces like <unk>, <s> are special in practice; "<...>" pieces with no
        // byte meaning are kept literally (what Decode prints for them).
      }
    } else {
      size_t i = 0;
      bool mapped = true;
      while (i < s.size()) {
        int64_t cp = NextCodePoint(s, &i);
        int b = cp < 0 ? -1 : byte_level::CharToByte(static_cast<char32_t>(cp));
        if (b < 0) {
          mapped = false;
          break;
        }
        out.push_back(static_cast<char>(b));
      }
      if (!mapped) out = s;  // an added token: its text is its bytes
    }
    bytes[id] = std::move(out);
  }
  // Ids the tokenizer does not decode to anything (<unk>, bos/eos when not marked special).
  for (auto id : {tok.bos_id(), tok.eos_id()}) {
    if (id.has_value() && *id >= 0 && *id < tok.vocab_size()) bytes[*id].clear();
  }
  if (auto unk = tok.TokenToId("<unk>"); unk.has_value()) bytes[*unk].clear();
  return FromBytes(std::move(bytes));
}

}  // namespace tandem::grammar
