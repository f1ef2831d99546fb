#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"
#include "common/grammar/state_graph.h"
#include "common/grammar/token_vocab.h"

namespace tandem::grammar {

// Allowed tokens as a bitset: bit (id % 64) of word id / 64.
using TokenMask = std::vector<uint64_t>;

// A grammar compiled against one vocabulary, plus what every sequence using it shares: the
// state graph (memoised Earley states and transitions) and the token mask of each state seen
// (thread-safe: masks are computed on worker threads).
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                  int64_t max_cache_bytes = 64 << 20);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  int32_t mask_words() const { return (vocab_->size() + 63) / 64; }

  StateGraph& graph() const { return *graph_; }
  std::shared_ptr<const TokenMask> FindMask(int32_t state) const;
  void StoreMask(int32_t state, std::shared_ptr<const TokenMask> mask) const;
  int64_t cache_hits() const;
  int64_t cache_misses() const;

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::unique_ptr<StateGraph> graph_;
  int64_t max_entries_;
  mutable std::mutex mu_;
  mutable absl::flat_hash_map<int32_t, std::shared_ptr<const TokenMask>> masks_;
  mutable int64_t hits_ = 0;
  mutable int64_t misses_ = 0;
};

}  // namespace tandem::grammar
