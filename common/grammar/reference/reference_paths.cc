#include "common/grammar/reference/reference_paths.h"

namespace tandem::grammar {

TokenMask ReferencePaths::UncachedMask(GrammarMatcher& matcher) {
  return matcher.ComputeMaskUncached();
}

TokenMask ReferencePaths::MaskByPosition(GrammarMatcher& matcher) {
  return matcher.ComputeMaskByPosition();
}

std::shared_ptr<const CompiledGrammar> ReferencePaths::WithCompleteItems(
    Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
    const CompiledGrammarOptions& options) {
  return std::shared_ptr<const CompiledGrammar>(new CompiledGrammar(std::move(grammar),
                                                                    std::move(vocab), options,
                                                                    /*memory=*/nullptr,
                                                                    /*keep_complete_items=*/true));
}

}  // namespace tandem::grammar
