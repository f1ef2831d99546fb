#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/grammar/compile_budget.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

// The Earley item sets of one grammar, hash-consed into states shared by every sequence: an
// item's origin names the state it started in (kSelf: this one), so a set's future depends only
// on its id, and the byte transitions between states are computed once and memoised. Equal ids
// mean equal futures, which makes the id an exact key for token masks.
//
// Complete items are dropped from a state once its closure ran (only the flags they set stay):
// nothing later reads them, and keeping them would split one parse position into a state per
// previous character.
//
// Positions: a state's *erased* form is its item set with every origin outside it replaced by
// kExternal (the context forgotten); its *position* keeps one level of context: each origin o is
// replaced by o's erased form. Parsing on from a position is the parse of every state with that
// position minus what the forgotten context would add when an item with an external origin
// completes ("pops"); states reached that way have pops() set. Every state with the same position
// (the same place in the grammar, whatever lies below its parents on the parse stack) shares the
// position's context-independent token sets (CompiledGrammar).
//
// Bound: the graph's memory is capped (`max_bytes`); past it no new state is made, Step answers
// kExhausted and exhausted() stays true (the grammar is too ambiguous or too large to serve).
// bytes() is what the graph really allocated (states one allocation each, so no growth slack;
// their items, index keys and hash slots; the closure scratch), checked against real allocation
// by grammar_memory_test. A charge hook (set_charge) may also refuse a state: the budget shared
// by every grammar of a compiler (GrammarMemory); such a refusal does not set exhausted().
//
// Interruption: while a CompileBudget is set (set_budget), closures check it per item and Step
// answers kInterrupted (never memoised) once it ran out, so a trie walk stops within a few steps.
//
// Thread-safety: every method requires the caller to hold mu() (matchers of many sequences and
// the mask worker share one graph).
class StateGraph {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kExhausted = -3;
  static constexpr int32_t kInterrupted = -4;
  static constexpr int32_t kSelf = -1;
  static constexpr int32_t kExternal = -3;
  static constexpr int64_t kDefaultMaxBytes = int64_t{256} << 20;

  explicit StateGraph(const Grammar* grammar, int64_t max_bytes = kDefaultMaxBytes)
      : StateGraph(grammar, max_bytes, /*keep_complete_items=*/false) {}

  std::mutex& mu() const { return mu_; }
  int32_t initial() const { return 0; }
  // Called with the bytes a new state (`may_refuse`) or a grown table (already allocated, or
  // negative when one shrank) adds; false refuses the new state. Set before the graph is shared.
  using ChargeFn = std::function<bool(int64_t delta, bool may_refuse)>;
  // The hook is charged at once with what the graph already holds.
  void set_charge(ChargeFn charge);
  // While set (not owned), closures and steps check `budget` (see above); null clears it and
  // the interruption.
  void set_budget(CompileBudget* budget) {
    budget_ = budget;
    interrupted_ = false;
  }
  bool interrupted() const { return interrupted_; }

  // The state after `byte` from `state`, kDead, kExhausted (a bound refused a new state), or
  // kInterrupted (the budget set by set_budget ran out).
  int32_t Step(int32_t state, uint8_t byte);
  // The position of `state` (a state itself; equal to `state` when nothing in it has an origin
  // outside it), or kExhausted.
  int32_t Position(int32_t state);
  // The erased form of `state` (see above), or kExhausted.
  int32_t Erased(int32_t state);
  // An item of this state with an external origin is complete: the context would continue here.
  bool pops(int32_t state) const { return states_[state].pops; }
  const ByteSet& next(int32_t state) const { return states_[state].next; }
  bool accepting(int32_t state) const { return states_[state].accepting; }
  // Every byte in `bytes` leads from `state` back to itself (answers memoised per byte; stops at
  // the first byte that does not, so a state that is no loop costs one step).
  bool LoopsOn(int32_t state, const ByteSet& bytes);
  int64_t num_states() const { return static_cast<int64_t>(states_.size()); }
  // Memory held by the graph (counted against max_bytes; see above).
  int64_t bytes() const { return bytes_; }
  int64_t max_bytes() const { return max_bytes_; }
  // Readable without mu() (the compiler's cache checks it under its own lock).
  bool exhausted() const { return exhausted_.load(std::memory_order_relaxed); }
  // How many times Step/Position answered kExhausted (a caller compares before and after).
  int64_t refusals() const { return refusals_; }
  // Of those, refused by the charge hook (the shared budget) rather than max_bytes.
  int64_t charge_refusals() const { return charge_refusals_; }
  // The last refusal came from the charge hook.
  bool last_refusal_charged() const { return last_refusal_charged_; }

 private:
  friend class CompiledGrammar;
  // `keep_complete_items`: the earlier, larger graph (no dropping; the benchmark's baseline, made
  // only through ReferencePaths).
  StateGraph(const Grammar* grammar, int64_t max_bytes, bool keep_complete_items);

  struct Item {
    int32_t prod;
    int32_t dot;
    int32_t origin;  // a state id, or kSelf
  };
  struct State {
    std::vector<Item> items;  // sorted; incomplete items only (unless keep_complete_items)
    ByteSet next;
    bool accepting = false;
    bool pops = false;
    int32_t position;
    int32_t erased;
    ByteSet loop_yes;  // bytes known to lead back to this state
    ByteSet loop_no;   // bytes known not to
    int32_t transitions[256];
  };

  int32_t Intern(std::vector<Item> items);
  // False when the budget ran out on the way (the items are then incomplete).
  bool Closure(std::vector<Item>* items);
  // Counts table growth (index slots, closure scratch) into bytes_ and charges it.
  void CountTables();

  const Grammar* g_;
  int64_t max_bytes_;
  bool keep_complete_items_;
  int64_t bytes_ = 0;
  int64_t table_bytes_ = 0;  // of bytes_: index slots and closure scratch
  std::atomic<bool> exhausted_{false};
  int64_t refusals_ = 0;
  int64_t charge_refusals_ = 0;
  bool last_refusal_charged_ = false;
  ChargeFn charge_;
  CompileBudget* budget_ = nullptr;
  bool interrupted_ = false;
  mutable std::mutex mu_;
  std::deque<State> states_;  // one allocation per state (they are large): no growth slack
  absl::flat_hash_map<std::string, int32_t> ids_;
  // Scratch for Closure: dedupe by (prod, dot, origin).
  absl::flat_hash_map<uint64_t, bool> seen_;
};

}  // namespace tandem::grammar
