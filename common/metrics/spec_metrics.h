#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/engine/spec_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of speculative decoding (DESIGN §4), labelled by proposer (ngram, draft).
// Acceptance rate = accepted / draft tokens; mean acceptance length = accepted / verifications
// (each verification also yields one token from the target itself). Thread-safe.
//
//   tandem_spec_draft_tokens_total{proposer}         tokens proposed
//   tandem_spec_accepted_tokens_total{proposer}      of which the target accepted
//   tandem_spec_verifications_total{proposer}        sequence-steps that verified a proposal
//   tandem_spec_acceptance_length{proposer}          histogram: accepted tokens per verification
//   tandem_spec_accepted_at_position_total{proposer,position}
//                                                    proposals whose position i (0-based) was
//                                                    accepted; position < kMaxPositions
class SpecMetrics : public SpecHooks {
 public:
  SpecMetrics(prometheus::Registry* registry, std::string_view proposer);
  SpecMetrics(const SpecMetrics&) = delete;
  SpecMetrics& operator=(const SpecMetrics&) = delete;

  // One sequence's proposal of `drafted` tokens, of which the first `accepted` were kept.
  void OnVerification(int64_t drafted, int64_t accepted) override;

  static constexpr int kMaxPositions = 16;  // the engine drafts at most 16 tokens

 private:
  prometheus::Counter* accepted_at_[kMaxPositions];
  prometheus::Counter* drafted_;
  prometheus::Counter* accepted_;
  prometheus::Counter* verifications_;
  prometheus::Histogram* length_;
};

}  // namespace tandem
