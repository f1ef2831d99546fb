#include "tools/bench/workload.h"

#include <algorithm>

namespace tandem::bench {

Workload::Workload(const WorkloadOptions& options) : options_(options), rng_(options.seed) {
  options_.first_token_id = std::clamp(options_.first_token_id, 0, options_.vocab_size - 1);
  for (int64_t p = 0; p < options_.num_prefixes; ++p) {
    std::vector<int32_t> prefix(options_.prefix_len);
    for (int32_t& t : prefix) t = RandomToken();
    prefixes_.push_back(std::move(prefix));
  }
}

int32_t Workload::RandomToken() {
  return std::uniform_int_distribution<int32_t>(options_.first_token_id,
                                                options_.vocab_size - 1)(rng_);
}

RequestSpec Workload::Next() {
  RequestSpec spec;
  spec.index = next_index_++;
  int64_t suffix = SampleLength(options_.prompt_len, rng_);
  int64_t output = SampleLength(options_.output_len, rng_);
  const bool cancel = std::uniform_real_distribution<double>(0, 1)(rng_) < options_.cancel_fraction;
  if (!prefixes_.empty()) {
    spec.prefix_id =
        std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(prefixes_.size()) - 1)(rng_);
  }
  const int64_t prefix = spec.prefix_id >= 0 ? options_.prefix_len : 0;
  if (options_.max_model_len > 0) {
    // Keep at least one suffix token (so prompts stay distinct) and one output token.
    const int64_t room = options_.max_model_len - prefix;
    suffix = std::clamp<int64_t>(suffix, 1, std::max<int64_t>(1, room - 1));
    output = std::clamp<int64_t>(output, 1, std::max<int64_t>(1, room - suffix));
  }
  spec.prompt.reserve(prefix + suffix);
  if (spec.prefix_id >= 0) spec.prompt = prefixes_[spec.prefix_id];
  for (int64_t i = 0; i < suffix; ++i) spec.prompt.push_back(RandomToken());
  spec.max_tokens = static_cast<int32_t>(output);
  if (cancel) {
    spec.cancel_after =
        std::uniform_int_distribution<int32_t>(1, std::max<int32_t>(1, spec.max_tokens - 1))(rng_);
  }
  return spec;
}

PoissonArrivals::PoissonArrivals(double rate_per_s, uint64_t seed) : rng_(seed), gap_(rate_per_s) {}

double PoissonArrivals::NextGapSeconds() { return gap_(rng_); }

}  // namespace tandem::bench
