#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/grammar/compile_budget.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/constraint.h"
#include "common/grammar/grammar.h"
#include "common/grammar/grammar_memory.h"
#include "common/grammar/token_vocab.h"

namespace tandem::grammar {

// The grammar text (form of README.md) a constraint stands for.
absl::StatusOr<std::string> ConstraintToGrammarText(const Constraint& constraint);

struct GrammarCompilerOptions {
  GrammarLimits limits;
  CompiledGrammarOptions grammar;  // each grammar's own bounds
  // Bytes of every grammar this compiler made, together: cached ones and those sequences hold
  // (GrammarMemory says how it is kept).
  int64_t max_bytes = int64_t{512} << 20;
  // Also at most this many cached grammars (0: bounded by bytes only).
  int64_t max_entries = 0;
  // A compile also computes the grammar's first mask (inside its budget), so the first decoding
  // step of a request finds it cached instead of walking the vocabulary on the engine's path.
  bool warm_first_mask = true;
};

// Compiles constraints against one vocabulary and caches the result by the constraint's content
// (kind, text, choices and flags), so repeated schemas compile once and share their mask cache.
// Every grammar it makes is charged to one GrammarMemory (memory_stats()): the cache is bounded
// in bytes. A cached grammar whose state graph reached its bound is evicted: the next request
// for it compiles afresh (sequences still on the old one fail with RESOURCE_EXHAUSTED only if
// they need a state it refused). Thread-safe; Compile runs on the caller's thread
// (GrammarCompileService runs it on worker threads).
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocab> vocab,
                           GrammarCompilerOptions options = {});
  // A cache of at most `max_entries` grammars (and the default byte budget).
  GrammarCompiler(std::shared_ptr<const TokenVocab> vocab, size_t max_entries,
                  GrammarLimits limits = {}, CompiledGrammarOptions options = {});
  ~GrammarCompiler();

  // The cache key of a constraint: its whole content.
  static std::string CacheKey(const Constraint& constraint);
  // The cached grammar for `key`, or null (never compiles).
  std::shared_ptr<const CompiledGrammar> Lookup(const std::string& key);
  // The cached grammar, or a new one compiled (and cached) within `budget` (not owned; null:
  // unlimited): INVALID_ARGUMENT for a constraint that does not compile or that ran past the
  // budget, CANCELLED when the budget was cancelled.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Constraint& constraint,
                                                                 CompileBudget* budget = nullptr);

  const TokenVocab& vocab() const { return *vocab_; }
  const GrammarCompilerOptions& options() const { return options_; }
  int64_t hits() const;
  GrammarMemoryStats memory_stats() const { return memory_->stats(); }

 private:
  std::shared_ptr<const TokenVocab> vocab_;
  GrammarCompilerOptions options_;
  std::shared_ptr<GrammarMemory> memory_;
};

}  // namespace tandem::grammar
