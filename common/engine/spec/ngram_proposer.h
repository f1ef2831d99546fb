#pragma once

#include "common/engine/spec/proposer.h"

namespace tandem {

// Prompt lookup decoding: finds the most recent earlier occurrence of the sequence's last n
// tokens (n from max_n down to min_n) in its own prompt and output, and proposes the k tokens
// that followed it; a match whose continuation runs into the end of the sequence is continued
// periodically (a repeating span is proposed k deep). No model; proposals are deterministic.
class NgramProposer : public Proposer {
 public:
  NgramProposer(int32_t max_n, int32_t min_n) : max_n_(max_n), min_n_(min_n) {}
  absl::Status Propose(const std::vector<SpecRequest>& requests,
                       std::vector<Proposal>* out) override;

  // The lookup for one token sequence (exposed for tests).
  static std::vector<int32_t> Lookup(const std::vector<int32_t>& tokens, int32_t max_n,
                                     int32_t min_n, int32_t k);

 private:
  int32_t max_n_;
  int32_t min_n_;
};

}  // namespace tandem
