#include "router/stop_matcher.h"

#include <algorithm>

namespace tandem {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_in_output)
    : include_(include_stop_in_output) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::Feed(std::string_view delta) {
  if (stopped_) return "";
  held_.append(delta);
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // Earliest match wins; among matches at the same position, the longest.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    if (pos < best || (pos == best && s.size() > best_stop->size())) {
      best = pos;
      best_stop = &s;
    }
  }
  if (best_stop != nullptr) {
    stopped_ = true;
    matched_ = *best_stop;
    std::string out = held_.substr(0, include_ ? best + best_stop->size() : best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

}  // namespace tandem
