#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/sampler/sampler.h"

namespace tandem {

// One sequence asking for a speculation this step.
struct SpecRequest {
  int64_t seq_id = 0;
  const std::vector<int32_t>* tokens = nullptr;  // prompt + output so far
  int64_t prompt_len = 0;
  int32_t k = 0;  // tokens wanted at most
  const SamplingParams* params = nullptr;
};

// Up to k proposed tokens. When the proposer samples (a draft model at temperature > 0), q[i] is
// the distribution tokens[i] was drawn from; an empty q means each token was proposed
// deterministically (a point mass), as n-gram lookup and greedy drafting do.
struct Proposal {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> q;
};

// Proposes draft tokens for the target model to verify (n-gram lookup, a draft model, ...).
// Engine thread only.
class Proposer {
 public:
  virtual ~Proposer() = default;
  // out->size() == requests.size() afterwards; a proposal may be shorter than asked, or empty.
  virtual absl::Status Propose(const std::vector<SpecRequest>& requests,
                               std::vector<Proposal>* out) = 0;
  // After verification: the sequence's tokens now hold `accepted` of the proposal (and one more
  // token from the target). Draft models roll back their KV past what was accepted.
  virtual void OnVerified(int64_t seq_id, int64_t num_tokens_before, int32_t accepted) {}
  // The sequence ended (or was preempted): drop its state.
  virtual void Release(int64_t seq_id) {}
  virtual int64_t blocks_in_use() const { return 0; }
};

}  // namespace tandem
