#pragma once

#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "common/tokenizer/pattern.h"

namespace tandem {

// What Split does with the delimiters it finds (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Parses "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous".
bool ParseSplitBehavior(std::string_view name, SplitBehavior* behavior);

// The [begin, end) ranges to keep, in order, given pieces that cover a text (from
// Pattern::FindMatches). May contain empty ranges; callers drop them.
std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<PatternPiece>& pieces,
                                                          SplitBehavior behavior);

}  // namespace tandem
