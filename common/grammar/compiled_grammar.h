#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"
#include "common/grammar/grammar_memory.h"
#include "common/grammar/state_graph.h"
#include "common/grammar/token_vocab.h"

namespace tandem::grammar {

// Allowed tokens as a bitset: bit (id % 64) of word id / 64.
using TokenMask = std::vector<uint64_t>;

// The context-independent token sets of one grammar position (StateGraph::Position): tokens the
// position accepts whatever the context (`accepted`), and tokens whose fate depends on the
// context because an item of the position completes inside them (`uncertain`, ids in byte
// order, checked against the full state at run time). Every other token is refused by the
// position alone.
struct PositionTokens {
  TokenMask accepted;
  std::vector<int32_t> uncertain;
};

// Memory bounds of what a compiled grammar accumulates while serving.
struct CompiledGrammarOptions {
  int64_t max_mask_cache_bytes = int64_t{64} << 20;        // per-state masks (cleared when full)
  int64_t max_position_cache_bytes = int64_t{64} << 20;    // per-position token sets (same)
  int64_t max_graph_bytes = StateGraph::kDefaultMaxBytes;  // the state graph (refused past it)
};

// A grammar compiled against one vocabulary, plus what every sequence using it shares: the
// state graph (memoised Earley states and transitions), the context-independent token sets of
// each position seen, and the token mask of each state seen (thread-safe: masks are computed on
// worker threads).
//
// Memory: memory_bytes() is what it holds (grammar structure, graph, caches; the shared
// vocabulary not included), kept as it grows. Made with a GrammarMemory, every byte is charged
// to it (which may refuse a new state or a cache entry, or clear the caches: ClearCaches) and
// released on destruction.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                  const CompiledGrammarOptions& options = {},
                  std::shared_ptr<GrammarMemory> memory = nullptr);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Grammar& grammar() const { return grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  int32_t mask_words() const { return (vocab_->size() + 63) / 64; }
  // The budget this grammar is charged to (null: none).
  const GrammarMemory* memory() const { return memory_.get(); }

  StateGraph& graph() const { return *graph_; }
  std::shared_ptr<const TokenMask> FindMask(int32_t state) const;
  void StoreMask(int32_t state, std::shared_ptr<const TokenMask> mask) const;
  std::shared_ptr<const PositionTokens> FindPosition(int32_t position) const;
  void StorePosition(int32_t position, std::shared_ptr<const PositionTokens> tokens) const;
  // Records that a state with `position` was seen; true the first time. Position sets pay off
  // only for a position shared by several states: the first one is served by a direct walk.
  bool FirstSightOf(int32_t position) const;
  int64_t cache_hits() const;
  int64_t cache_misses() const;
  int64_t position_hits() const;
  int64_t position_misses() const;

  // Bytes held: grammar structure + state graph + caches (any thread, no lock).
  int64_t memory_bytes() const { return charged_.load(std::memory_order_relaxed); }
  // Of which the mask and position caches (and the positions seen).
  int64_t cache_bytes() const { return cache_bytes_.load(std::memory_order_relaxed); }
  // Empties the mask and position caches (they refill as states are met again); the bytes freed.
  int64_t ClearCaches() const;

  // The most CPU time computing one of this grammar's masks took (or was allowed before it was
  // cut), as whoever computed it noted it (the compiler's first mask, the engine), in
  // microseconds: the engine computes the masks of a grammar known to be expensive off its loop.
  void NoteMaskCost(int64_t cpu_us) const {
    int64_t seen = max_mask_us_.load(std::memory_order_relaxed);
    while (cpu_us > seen && !max_mask_us_.compare_exchange_weak(seen, cpu_us)) {
    }
  }
  int64_t max_mask_cost_us() const { return max_mask_us_.load(std::memory_order_relaxed); }

 private:
  friend class ReferencePaths;  // the benchmark's baseline graph (reference/)
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                  const CompiledGrammarOptions& options, std::shared_ptr<GrammarMemory> memory,
                  bool keep_complete_items);

  // Charges `delta` bytes of `kind` (false: refused, nothing charged); negative releases.
  bool Charge(int64_t delta, GrammarMemory::Kind kind) const;
  // Clears the caches with mu_ held; the bytes freed.
  int64_t ClearCachesLocked() const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::shared_ptr<GrammarMemory> memory_;
  std::unique_ptr<StateGraph> graph_;
  int64_t max_mask_bytes_;
  int64_t max_position_bytes_;
  mutable std::atomic<int64_t> charged_{0};
  mutable std::atomic<int64_t> cache_bytes_{0};
  mutable std::atomic<int64_t> max_mask_us_{0};
  mutable std::mutex mu_;
  mutable absl::flat_hash_map<int32_t, std::shared_ptr<const TokenMask>> masks_;
  mutable absl::flat_hash_map<int32_t, std::shared_ptr<const PositionTokens>> positions_;
  mutable absl::flat_hash_set<int32_t> seen_positions_;
  mutable int64_t mask_bytes_ = 0;      // of cache_bytes_ (under mu_)
  mutable int64_t position_bytes_ = 0;  // of cache_bytes_: sets and positions seen (under mu_)
  mutable int64_t hits_ = 0;
  mutable int64_t misses_ = 0;
  mutable int64_t position_hits_ = 0;
  mutable int64_t position_misses_ = 0;
};

}  // namespace tandem::grammar
