#include "common/tokenizer/bpe_model.h"

#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/absl_view.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(const nlohmann::json& model,
                                                           BpeVocabData data) {
  const std::string type = json_util::GetString(model, "type", "BPE");
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat("unsupported model type '", type, "'"));
  }
  if (json_util::Has(model, "dropout") && model.at("dropout").get<double>() > 0) {
    return absl::UnimplementedError("BPE dropout is not supported");
  }
  if (!data.has_vocab) return absl::InvalidArgumentError("model.vocab must be an object");
  if (!data.has_merges) return absl::InvalidArgumentError("model.merges must be an array");
  std::unique_ptr<BpeModel> bpe(new BpeModel());

  // data.vocab_strings becomes the pool that the vocab map points into.
  int64_t max_id = -1;
  for (const auto& entry : data.vocab) {
    if (entry.id < 0 || entry.id >= (int64_t{1} << 31) - 1) {
      return absl::InvalidArgumentError(absl::StrCat("vocab id out of range: ", entry.id));
    }
    max_id = std::max(max_id, entry.id);
  }
  bpe->pool_ = std::move(data.vocab_strings);
  bpe->entries_.resize(static_cast<size_t>(max_id + 1));
  bpe->vocab_.reserve(data.vocab.size());
  for (const auto& [token, id] : data.vocab) {
    Entry& entry = bpe->entries_[id];
    if (entry.length >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("vocab id ", id, " is used twice"));
    }
    entry.offset = token.offset;
    entry.length = static_cast<int32_t>(token.length);
    bpe->vocab_.emplace(absl::string_view(bpe->pool_.data() + token.offset, token.length),
                        static_cast<int32_t>(id));
  }

  bpe->byte_fallback_ = json_util::GetBool(model, "byte_fallback", false);
  bpe->fuse_unk_ = json_util::GetBool(model, "fuse_unk", false);
  bpe->ignore_merges_ = json_util::GetBool(model, "ignore_merges", false);
  bpe->continuing_subword_prefix_ = json_util::GetString(model, "continuing_subword_prefix", "");
  bpe->end_of_word_suffix_ = json_util::GetString(model, "end_of_word_suffix", "");
  if (json_util::Has(model, "unk_token")) {
    const std::string unk = model.at("unk_token").get<std::string>();
    bpe->unk_id_ = bpe->Lookup(unk);
    if (!bpe->unk_id_.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("unk_token '", unk, "' is not in the vocab"));
    }
  }
  for (int b = 0; b < 256; ++b) {
    bpe->byte_ids_[b] = bpe->Lookup(absl::StrFormat("<0x%02X>", b)).value_or(-1);
  }

  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  bpe->merges_.reserve(data.merges.size());
  std::string merged;
  int32_t rank = 0;
  const std::string_view pool(data.merge_strings);
  for (const auto& merge : data.merges) {
    const std::string_view a = pool.substr(merge.left.offset, merge.left.length);
    const std::string_view b = pool.substr(merge.right.offset, merge.right.length);
    const auto a_id = bpe->TokenToId(a);
    const auto b_id = bpe->TokenToId(b);
    if (!a_id.has_value() || !b_id.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("merge '", std::string(a), " ", std::string(b),
                                                     "' uses a token that is not in the vocab"));
    }
    merged.assign(a);
    merged.append(b.substr(std::min(prefix_len, b.size())));
    const auto new_id = bpe->Lookup(merged);
    if (!new_id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge result '", merged, "' is not in the vocab"));
    }
    bpe->merges_[PairKey(*a_id, *b_id)] = MergeResult{rank, *new_id};
    ++rank;
  }
  return bpe;
}

std::optional<int32_t> BpeModel::Lookup(absl::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  return Lookup(AbslView(token));
}

std::optional<std::string_view> BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || entries_[id].length < 0) return std::nullopt;
  return std::string_view(pool_.data() + entries_[id].offset, entries_[id].length);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = Lookup(AbslView(word))) {
      ids->push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&symbols](int32_t id, uint32_t length) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1, length});
  };
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  int32_t unk_id = -1;  // pending unknown token (fused over several characters), if >= 0
  uint32_t unk_len = 0;
  std::string scratch;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    pos += std::min(unicode::Utf8Length(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const uint32_t byte_len = static_cast<uint32_t>(pos - begin);
    std::string_view piece = word.substr(begin, byte_len);
    if (affixes) {
      scratch.clear();
      if (begin != 0) scratch.append(continuing_subword_prefix_);
      scratch.append(piece);
      if (pos == word.size()) scratch.append(end_of_word_suffix_);
      piece = scratch;
    }
    if (const auto id = Lookup(AbslView(piece))) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : piece) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : piece) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = *unk_id_;
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);
  if (symbols.empty()) return;
  symbols.back().next = -1;
  MergeWord(&symbols);
  for (const Symbol& s : symbols) {
    if (s.length != 0) ids->push_back(s.id);
  }
}

void BpeModel::MergeWord(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto find_merge = [this](int32_t a, int32_t b) -> const MergeResult* {
    const auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeResult* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push(Candidate{m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  const int32_t n = static_cast<int32_t>(symbols.size());
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.length == 0 || left.next == -1) continue;
    const int32_t next_pos = left.next;
    const Symbol right = symbols[next_pos];
    const MergeResult* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.length += right.length;
    left.next = right.next;
    symbols[next_pos].length = 0;
    if (right.next > -1 && right.next < n) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeResult* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push(Candidate{m->rank, left.prev, m->new_id});
      }
    }
    if (left.next > -1 && left.next < n) {
      if (const MergeResult* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push(Candidate{m->rank, top.pos, m->new_id});
      }
    }
  }
}

}  // namespace tandem
