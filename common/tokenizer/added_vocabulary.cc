#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/absl_view.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Start of the whitespace run that ends text[..end] (Rust char::is_whitespace).
size_t WhitespaceRunStart(std::string_view text, size_t floor, size_t end) {
  size_t begin = end;
  while (begin > floor) {
    size_t start = begin - 1;
    while (start > floor && IsContinuation(text[start])) --start;
    size_t probe = start;
    if (!unicode::IsWhitespace(unicode::NextCodePoint(text, &probe))) break;
    begin = start;
  }
  return begin;
}

// End of the whitespace run that starts at text[begin].
size_t WhitespaceRunEnd(std::string_view text, size_t begin) {
  size_t end = begin;
  while (end < text.size()) {
    size_t next = end;
    if (!unicode::IsWhitespace(unicode::NextCodePoint(text, &next))) break;
    end = next;
  }
  return end;
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view pattern, int32_t token) {
  int32_t node = 0;
  for (unsigned char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
    auto it = edges.find(key);
    if (it == edges.end()) {
      nodes.push_back(Node{});
      it = edges.emplace(key, static_cast<int32_t>(nodes.size() - 1)).first;
    }
    node = it->second;
  }
  if (nodes[node].token < 0) nodes[node].token = token;  // first pattern wins on duplicates
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

std::optional<std::pair<int32_t, size_t>> AddedVocabulary::Trie::LongestAt(std::string_view text,
                                                                           size_t pos) const {
  std::optional<std::pair<int32_t, size_t>> best;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto it =
        edges.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == edges.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) best = std::make_pair(nodes[node].token, i + 1 - pos);
  }
  return best;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  // HF matches special tokens' patterns before the others on equal matches.
  std::stable_partition(tokens.begin(), tokens.end(),
                        [](const AddedToken& t) { return t.special; });
  bool any_single_word = false;
  for (AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    if (token.id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token '", token.content, "' has a negative id"));
    }
    const int32_t index = static_cast<int32_t>(vocab->tokens_.size());
    if (!vocab->by_id_.emplace(token.id, index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token id ", token.id, " is used twice"));
    }
    vocab->by_content_.emplace(token.content, index);
    if (token.special) vocab->special_contents_.insert(token.content);
    any_single_word = any_single_word || token.single_word;
    if (token.normalized) {
      std::string pattern = token.content;
      if (normalizer != nullptr) normalizer->Normalize(&pattern);
      if (!pattern.empty()) vocab->normalized_trie_.Insert(pattern, index);
    } else {
      vocab->raw_trie_.Insert(token.content, index);
    }
    vocab->tokens_.push_back(std::move(token));
  }
  if (any_single_word) {
    TANDEM_ASSIGN_OR_RETURN(vocab->word_char_, Regex::Compile(R"(\A\w\z)"));
  }
  return vocab;
}

bool AddedVocabulary::IsWordChar(std::string_view text, size_t begin, size_t end) const {
  return !word_char_->FindAll(text.substr(begin, end - begin)).empty();
}

std::vector<AddedSplit> AddedVocabulary::Split(std::string_view text, bool normalized,
                                               bool match_special) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  std::vector<AddedSplit> splits;
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto match = trie.LongestAt(text, pos);
    if (!match.has_value()) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[match->first];
    size_t start = pos;
    size_t stop = pos + match->second;
    pos = stop;  // matches never overlap, accepted or not
    if (!match_special && token.special) continue;
    if (token.single_word) {
      bool word_before = false;
      if (start > 0) {
        size_t prev = start - 1;
        while (prev > 0 && IsContinuation(text[prev])) --prev;
        word_before = IsWordChar(text, prev, start);
      }
      bool word_after = false;
      if (stop < text.size()) {
        const size_t next =
            stop + std::min(unicode::Utf8Length(static_cast<unsigned char>(text[stop])),
                            text.size() - stop);
        word_after = IsWordChar(text, stop, next);
      }
      if (word_before || word_after) continue;
    }
    if (token.lstrip) start = std::max(WhitespaceRunStart(text, 0, start), start_offset);
    if (token.rstrip) stop = WhitespaceRunEnd(text, stop);
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, token.id});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset != text.size() || text.empty()) {
    splits.push_back({start_offset, text.size(), -1});
  }
  return splits;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  const auto it = by_content_.find(AbslView(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

bool AddedVocabulary::IsSpecialContent(std::string_view content) const {
  return special_contents_.contains(AbslView(content));
}

}  // namespace tandem
