#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

// The Earley item sets of one grammar, hash-consed into states shared by every sequence: an
// item's origin names the state it started in (kSelf: this one), so a set's future depends only
// on its id, and the byte transitions between states are computed once and memoised. Equal ids
// mean equal futures, which makes the id an exact key for token masks.
//
// Thread-safety: every method requires the caller to hold mu() (matchers of many sequences and
// the mask worker share one graph).
class StateGraph {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kSelf = -1;

  explicit StateGraph(const Grammar* grammar);

  std::mutex& mu() const { return mu_; }
  int32_t initial() const { return 0; }
  // The state after `byte` from `state`, or kDead.
  int32_t Step(int32_t state, uint8_t byte);
  const ByteSet& next(int32_t state) const { return states_[state].next; }
  bool accepting(int32_t state) const { return states_[state].accepting; }
  // Every byte in `bytes` leads from `state` back to itself (answers memoised per byte; stops at
  // the first byte that does not, so a state that is no loop costs one step).
  bool LoopsOn(int32_t state, const ByteSet& bytes);
  int64_t num_states() const { return static_cast<int64_t>(states_.size()); }

 private:
  struct Item {
    int32_t prod;
    int32_t dot;
    int32_t origin;  // a state id, or kSelf
  };
  struct State {
    std::vector<Item> items;  // sorted
    ByteSet next;
    bool accepting = false;
    ByteSet loop_yes;  // bytes known to lead back to this state
    ByteSet loop_no;   // bytes known not to
    int32_t transitions[256];
  };

  int32_t Intern(std::vector<Item> items);
  void Closure(std::vector<Item>* items);

  const Grammar* g_;
  mutable std::mutex mu_;
  std::vector<State> states_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  // Scratch for Closure: dedupe by (prod, dot, origin).
  absl::flat_hash_map<uint64_t, bool> seen_;
};

}  // namespace tandem::grammar
