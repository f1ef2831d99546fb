#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/compile_budget.h"
#include "common/grammar/compiled_grammar.h"

namespace tandem::grammar {

// The parsing state of one sequence under a CompiledGrammar: the stack of Earley states (one per
// accepted byte, states shared through the grammar's StateGraph), so a token spanning several
// terminals or ending inside a UTF-8 character is just its bytes in order, and rolling back a
// token pops its bytes. Copyable (samples of one request fork it). Not thread-safe: one thread at
// a time (the engine hands it to the mask worker during the forward pass and takes it back
// before sampling).
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances over the token's bytes; false (state unchanged) when the grammar forbids them, the
  // token has no bytes, or the grammar's state graph hit its bound (then status() says so).
  bool AcceptToken(int32_t token);
  // Advances over raw bytes (not counted as a token for Rollback); false leaves it unchanged.
  bool AcceptBytes(std::string_view bytes);
  // Undoes the last `n` accepted tokens (speculative rejection).
  void Rollback(int32_t n);
  int32_t num_tokens() const { return static_cast<int32_t>(token_ends_.size()); }
  // The current state of the grammar's StateGraph.
  int32_t state() const { return states_.back(); }

  // The input so far is a complete sentence of the grammar.
  bool CanTerminate() const;
  // Complete and nothing may follow: generation must end here.
  bool IsTerminated() const;

  // The tokens whose bytes may come next (end-of-sequence tokens not included: allow them when
  // CanTerminate()). Served from the grammar's mask cache when this state was seen before, else
  // from the context-independent token sets of the state's position plus a check of the
  // position's context-dependent tokens against this state. When the state graph hits its
  // bound the mask may miss tokens: status() is then RESOURCE_EXHAUSTED and the mask unusable.
  std::shared_ptr<const TokenMask> NextTokenMask();
  // NextTokenMask within `budget` (checked in the Earley closures and the trie walk; not owned):
  // the mask, or the budget's status once it ran out (nothing cached then, the matcher
  // unchanged). Warms a new grammar's first mask inside its compile budget.
  absl::StatusOr<std::shared_ptr<const TokenMask>> NextTokenMaskWithin(CompileBudget* budget);
  // The cached mask of this state, or null when it was not computed yet (cheap: one lookup).
  std::shared_ptr<const TokenMask> CachedMask() const { return grammar_->FindMask(states_.back()); }
  // RESOURCE_EXHAUSTED once the grammar's state graph refused a state this sequence needed.
  const absl::Status& status() const { return status_; }

  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  friend class ReferencePaths;  // reference masks for tests and benchmarks (reference/)

  // The mask by a walk of the whole token trie from this state, without position sets or mask
  // cache.
  TokenMask ComputeMaskUncached();
  // The mask from position sets and the context check (computing the sets even for a position
  // seen for the first time), without the mask cache.
  TokenMask ComputeMaskByPosition();
  void Walk(StateGraph& graph, int32_t node, int32_t state, uint64_t* mask);
  void PositionWalk(StateGraph& graph, int32_t node, int32_t state, bool popped,
                    PositionTokens* out);
  std::shared_ptr<const PositionTokens> PositionTokensLocked(StateGraph& graph, int32_t position);
  TokenMask ComputeMaskLocked(StateGraph& graph, bool force_positions);
  void CheckExhausted(const StateGraph& graph, int64_t refusals_before);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> states_;      // states_[0]: initial; one more per accepted byte
  std::vector<int32_t> token_ends_;  // size of states_ after each accepted token
  absl::Status status_;
};

}  // namespace tandem::grammar
