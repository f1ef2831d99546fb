#include "common/metrics/spec_metrics.h"

#include <string>

#include "common/metrics/buckets.h"

namespace tandem {

SpecMetrics::SpecMetrics(prometheus::Registry* registry, std::string_view proposer) {
  const prometheus::Labels l = {{"proposer", std::string(proposer)}};
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add(l);
  };
  drafted_ = counter("tandem_spec_draft_tokens_total", "Speculative tokens proposed.");
  accepted_ = counter("tandem_spec_accepted_tokens_total",
                      "Speculative tokens accepted by the target model.");
  verifications_ = counter("tandem_spec_verifications_total",
                           "Sequence-steps that verified a speculative proposal.");
  length_ = &prometheus::BuildHistogram()
                 .Name("tandem_spec_acceptance_length")
                 .Help("Speculative tokens accepted per verification (0 .. proposal length).")
                 .Register(*registry)
                 .Add(l, buckets::AcceptedTokens());
  auto& at = prometheus::BuildCounter()
                 .Name("tandem_spec_accepted_at_position_total")
                 .Help("Speculative proposals whose token at this position (0-based) was accepted.")
                 .Register(*registry);
  for (int i = 0; i < kMaxPositions; ++i) {
    accepted_at_[i] =
        &at.Add({{"proposer", std::string(proposer)}, {"position", std::to_string(i)}});
  }
}

void SpecMetrics::OnVerification(int64_t drafted, int64_t accepted) {
  drafted_->Increment(static_cast<double>(drafted));
  accepted_->Increment(static_cast<double>(accepted));
  verifications_->Increment();
  length_->Observe(static_cast<double>(accepted));
  for (int64_t i = 0; i < accepted && i < kMaxPositions; ++i) accepted_at_[i]->Increment();
}

}  // namespace tandem
