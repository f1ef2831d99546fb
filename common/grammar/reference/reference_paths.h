#pragma once

#include <memory>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar.h"
#include "common/grammar/matcher.h"
#include "common/grammar/token_vocab.h"

namespace tandem::grammar {

// Reference paths of the matcher and the state graph, for tests and benchmarks only (the
// `tandem_grammar_reference` target; nothing that serves links it): masks computed without the
// caches that serve requests, and the earlier state graph the benchmark compares against.
class ReferencePaths {
 public:
  // The mask by a direct walk of the whole token trie from the matcher's state, without position
  // sets or the mask cache (sets the matcher's status() when the graph's bound refused a state).
  static TokenMask UncachedMask(GrammarMatcher& matcher);
  // The mask from the position's context-independent sets plus the context check, computing the
  // sets even for a position seen for the first time, without the mask cache.
  static TokenMask MaskByPosition(GrammarMatcher& matcher);
  // A compiled grammar whose state graph keeps complete items (the graph before they were
  // dropped: larger, loops do not close; the benchmark's baseline).
  static std::shared_ptr<const CompiledGrammar> WithCompleteItems(
      Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
      const CompiledGrammarOptions& options = {});
};

}  // namespace tandem::grammar
