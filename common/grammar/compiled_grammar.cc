#include "common/grammar/compiled_grammar.h"

#include <algorithm>

namespace tandem::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                                 const CompiledGrammarOptions& options)
    : CompiledGrammar(std::move(grammar), std::move(vocab), options,
                      /*keep_complete_items=*/false) {}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                                 const CompiledGrammarOptions& options, bool keep_complete_items)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      graph_(new StateGraph(&grammar_, options.max_graph_bytes, keep_complete_items)),
      max_position_bytes_(options.max_position_cache_bytes) {
  const int64_t mask_bytes = std::max<int64_t>(8, (vocab_->size() + 63) / 64 * 8);
  max_entries_ = std::max<int64_t>(16, options.max_mask_cache_bytes / mask_bytes);
}

std::shared_ptr<const TokenMask> CompiledGrammar::FindMask(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = masks_.find(state);
  if (it == masks_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return it->second;
}

void CompiledGrammar::StoreMask(int32_t state, std::shared_ptr<const TokenMask> mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded: when full, start over (states in use are recomputed once).
  if (static_cast<int64_t>(masks_.size()) >= max_entries_) masks_.clear();
  masks_.emplace(state, std::move(mask));
}

std::shared_ptr<const PositionTokens> CompiledGrammar::FindPosition(int32_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = positions_.find(position);
  if (it == positions_.end()) {
    ++position_misses_;
    return nullptr;
  }
  ++position_hits_;
  return it->second;
}

void CompiledGrammar::StorePosition(int32_t position,
                                    std::shared_ptr<const PositionTokens> tokens) const {
  const int64_t bytes = static_cast<int64_t>(tokens->accepted.size() * sizeof(uint64_t) +
                                             tokens->uncertain.size() * sizeof(int32_t) + 64);
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded like the masks: when full, start over.
  if (position_bytes_ + bytes > max_position_bytes_) {
    positions_.clear();
    seen_positions_.clear();
    position_bytes_ = 0;
  }
  if (positions_.emplace(position, std::move(tokens)).second) position_bytes_ += bytes;
}

bool CompiledGrammar::FirstSightOf(int32_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded with the position sets: 8 bytes an entry against the same budget's scale.
  if (static_cast<int64_t>(seen_positions_.size()) * 8 > max_position_bytes_) {
    seen_positions_.clear();
  }
  return seen_positions_.insert(position).second;
}

int64_t CompiledGrammar::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t CompiledGrammar::cache_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

int64_t CompiledGrammar::position_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return position_hits_;
}

int64_t CompiledGrammar::position_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return position_misses_;
}

}  // namespace tandem::grammar
