#include "common/tokenizer/split_behavior.h"

#include <algorithm>

namespace tandem {

bool ParseSplitBehavior(std::string_view name, SplitBehavior* behavior) {
  if (name == "Removed") {
    *behavior = SplitBehavior::kRemoved;
  } else if (name == "Isolated") {
    *behavior = SplitBehavior::kIsolated;
  } else if (name == "MergedWithPrevious") {
    *behavior = SplitBehavior::kMergedWithPrevious;
  } else if (name == "MergedWithNext") {
    *behavior = SplitBehavior::kMergedWithNext;
  } else if (name == "Contiguous") {
    *behavior = SplitBehavior::kContiguous;
  } else {
    return false;
  }
  return true;
}

std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<PatternPiece>& pieces,
                                                          SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(pieces.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& p : pieces) out.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& p : pieces) {
        if (!p.is_match) out.emplace_back(p.begin, p.end);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& p : pieces) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& p : pieces) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

}  // namespace tandem
