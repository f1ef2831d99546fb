#include "common/engine/spec/ngram_proposer.h"

#include <algorithm>

namespace tandem {

std::vector<int32_t> NgramProposer::Lookup(const std::vector<int32_t>& tokens, int32_t max_n,
                                           int32_t min_n, int32_t k) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int32_t n = std::min<int64_t>(max_n, len - 1); n >= min_n && n >= 1; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // Most recent earlier occurrence whose continuation exists.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, tokens.data() + start)) continue;
      // What followed, copied forward like an overlapping LZ77 match: once the copy reaches
      // the end of the sequence it goes on through the tokens it has just proposed, so a
      // repeating span (period len - follow) is proposed k tokens deep, not cut at one period.
      const int64_t follow = start + n;
      std::vector<int32_t> proposal;
      proposal.reserve(std::max(k, 0));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = follow + j;
        proposal.push_back(at < len ? tokens[at] : proposal[at - len]);
      }
      return proposal;
    }
  }
  return {};
}

absl::Status NgramProposer::Propose(const std::vector<SpecRequest>& requests,
                                    std::vector<Proposal>* out) {
  out->assign(requests.size(), Proposal());
  for (size_t i = 0; i < requests.size(); ++i) {
    (*out)[i].tokens = Lookup(*requests[i].tokens, max_n_, min_n_, requests[i].k);
  }
  return absl::OkStatus();
}

}  // namespace tandem
