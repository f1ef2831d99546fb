#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Finds stop strings in a stream of text deltas. Text that could still turn out to be the start
// of a stop string is held back until it cannot; held-back text never ends in the middle of a
// UTF-8 character because stop strings are valid UTF-8 (they start on a character boundary).
class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop_in_output);

  // Feeds a delta; returns the text that is safe to emit now. After a match, returns the text
  // up to the stop string (with it when include_stop_in_output) and stopped() turns true; later
  // calls return nothing.
  std::string Feed(std::string_view delta);
  // Releases the held-back text at the end of the stream.
  std::string Flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  bool include_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem
