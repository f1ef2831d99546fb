#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tools/bench/length_distribution.h"

namespace tandem::bench {

struct WorkloadOptions {
  // Prompt length; with shared prefixes, the length of each request's unique suffix.
  LengthDistribution prompt_len;
  LengthDistribution output_len;
  // num_prefixes > 0: every request starts with one of num_prefixes random prefixes of
  // prefix_len tokens (chosen uniformly), followed by its unique random suffix.
  int64_t num_prefixes = 0;
  int64_t prefix_len = 0;
  // Fraction of requests the client cancels after a random number of received tokens.
  double cancel_fraction = 0;
  // Token ids are drawn uniformly from [first_token_id, vocab_size).
  int32_t vocab_size = 0;
  int32_t first_token_id = 3;
  // Prompt + output tokens are capped at this (the server's context); 0: no cap.
  int64_t max_model_len = 0;
  uint64_t seed = 1;
};

// One request of the benchmark: token ids (no tokenizer needed) and its output length.
struct RequestSpec {
  int64_t index = 0;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 1;
  int32_t prefix_id = -1;     // which shared prefix, -1: none
  int32_t cancel_after = -1;  // cancel once this many tokens arrived; -1: never
};

// Deterministic for a given seed: the same options give the same request sequence.
class Workload {
 public:
  explicit Workload(const WorkloadOptions& options);

  RequestSpec Next();
  const std::vector<std::vector<int32_t>>& prefixes() const { return prefixes_; }

 private:
  int32_t RandomToken();

  WorkloadOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> prefixes_;
  int64_t next_index_ = 0;
};

// Request start times of a Poisson process: exponential gaps with mean 1 / rate.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_s, uint64_t seed);
  double NextGapSeconds();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace tandem::bench
