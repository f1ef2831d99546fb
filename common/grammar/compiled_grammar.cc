#include "common/grammar/compiled_grammar.h"

#include <algorithm>

namespace tandem::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                                 int64_t max_cache_bytes)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      graph_(std::make_unique<StateGraph>(&grammar_)) {
  const int64_t mask_bytes = std::max<int64_t>(8, (vocab_->size() + 63) / 64 * 8);
  max_entries_ = std::max<int64_t>(16, max_cache_bytes / mask_bytes);
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

int64_t CompiledGrammar::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t CompiledGrammar::cache_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace tandem::grammar
