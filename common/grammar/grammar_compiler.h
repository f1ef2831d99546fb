#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/constraint.h"
#include "common/grammar/grammar.h"
#include "common/grammar/token_vocab.h"

namespace tandem::grammar {

// The grammar text (form of README.md) a constraint stands for.
absl::StatusOr<std::string> ConstraintToGrammarText(const Constraint& constraint);

// Compiles constraints against one vocabulary and caches the result by the constraint's content
// (a hash of kind, text and flags), so repeated schemas compile once and share their mask cache.
// A cached grammar whose state graph reached its bound is evicted: the next request for it
// compiles afresh (sequences still on the old one fail with RESOURCE_EXHAUSTED only if they need
// a state it refused). Thread-safe.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocab> vocab, size_t max_entries = 256,
                           GrammarLimits limits = {}, CompiledGrammarOptions options = {});

  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Constraint& constraint);
  const TokenVocab& vocab() const { return *vocab_; }
  int64_t hits() const;

 private:
  std::shared_ptr<const TokenVocab> vocab_;
  size_t max_entries_;
  GrammarLimits limits_;
  CompiledGrammarOptions options_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  absl::flat_hash_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>,
                                             std::list<std::string>::iterator>>
      cache_;
  int64_t hits_ = 0;
};

}  // namespace tandem::grammar
