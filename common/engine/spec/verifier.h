#pragma once

#include <cstdint>

#include "common/engine/sampler/rng.h"
#include "common/engine/sampler/sampler.h"

namespace tandem {

// Speculative verification at one position (DESIGN §4): given the target's processed logits at
// that position and the drafted token there (or -1 for the bonus position after a fully
// accepted draft), decides the token the sequence takes.
//  - Greedy: the target's argmax; the draft is accepted when they are equal.
//  - Sampling: accept the draft x with probability min(1, p(x) / q(x)); on rejection sample
//    from normalize(max(0, p - q)). `q` is the distribution x was drawn from, or null when x was
//    proposed deterministically (a point mass at x). The bonus position samples from p.
// p is the target's distribution after the request's temperature / top-k / top-p / min-p, the
// same processing the proposer applied to produce q. The resulting token has exactly the target's
// distribution.
struct VerifyResult {
  int32_t token = 0;
  bool accepted = false;  // the drafted token was taken
};

VerifyResult VerifyPosition(const SamplingParams& params, const float* logits, int32_t vocab_size,
                            int32_t draft_token, const TokenDistribution* q, Rng& rng,
                            bool testing_always_accept = false);

}  // namespace tandem
