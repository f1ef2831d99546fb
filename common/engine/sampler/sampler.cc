#include "common/engine/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Candidate order: descending logit, then ascending id. Deterministic for equal logits.
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    if (logits[a] != logits[b]) return logits[a] > logits[b];
    return a < b;
  }
};

}  // namespace

float TokenDistribution::ProbOf(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return probs[i];
  }
  return 0.0f;
}

absl::Status ValidateSamplingParams(const SamplingParams& p, int32_t vocab_size) {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
  };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad("temperature", absl::StrCat("must be a finite value >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return bad("top_k", absl::StrCat("must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return bad("top_p", absl::StrCat("must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return bad("min_p", absl::StrCat("must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty", absl::StrCat("must be > 0, got ", p.repetition_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return bad("presence_penalty", absl::StrCat("must be in [-2, 2], got ", p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty", absl::StrCat("must be in [-2, 2], got ", p.frequency_penalty));
  }
  if (p.max_tokens < 1) return bad("max_tokens", absl::StrCat("must be >= 1, got ", p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return bad("min_tokens", absl::StrCat("must be in [0, max_tokens], got ", p.min_tokens));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return bad("logit_bias", absl::StrCat("token id ", id, " outside [0, ", vocab_size, ")"));
    }
    if (!std::isfinite(bias) || bias < -100.0f || bias > 100.0f) {
      return bad("logit_bias", absl::StrCat("bias for token ", id, " must be in [-100, 100]"));
    }
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("stop_token_ids", absl::StrCat("token id ", id, " outside [0, ", vocab_size, ")"));
    }
  }
  if (p.logprobs > 20) return bad("logprobs", absl::StrCat("must be <= 20, got ", p.logprobs));
  return absl::OkStatus();
}

void ProcessLogits(const SamplingParams& p, const TokenHistory& history,
                   absl::Span<const int32_t> stop_ids, float* logits, int32_t vocab_size) {
  LogitEdits edits;
  BuildLogitEdits(p, history, stop_ids, vocab_size, &edits);
  ApplyLogitEdits(edits, logits);
}

int32_t GreedyToken(const float* logits, int32_t vocab_size) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab_size; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

namespace {

bool Truncates(const SamplingParams& p, int32_t vocab_size) {
  return (p.top_k > 0 && p.top_k < vocab_size) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// exp((logit - max) / temperature) of every token into `e`; returns their sum (0 when every
// logit is -inf).
double ScaledExp(const float* logits, int32_t vocab_size, float temperature,
                 std::vector<float>* e) {
  const float max_logit = logits[GreedyToken(logits, vocab_size)];
  e->resize(vocab_size);
  if (std::isinf(max_logit) && max_logit < 0) return 0.0;
  const float inv_t = 1.0f / temperature;
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    const float v = std::exp((logits[i] - max_logit) * inv_t);
    (*e)[i] = v;
    sum += v;
  }
  return sum;
}

// Puts the smallest `k` of [first, last) by `cmp`, sorted, at its front (a selection, then a
// sort of the k only).
template <typename It, typename Cmp>
void SortPrefix(It first, It last, size_t k, Cmp cmp) {
  k = std::min(k, static_cast<size_t>(last - first));
  if (first + k < last) std::nth_element(first, first + k, last, cmp);
  std::sort(first, first + k, cmp);
}

}  // namespace

TokenDistribution ComputeDistribution(const SamplingParams& p, const float* logits,
                                      int32_t vocab_size) {
  std::vector<float> e;
  const double sum = ScaledExp(logits, vocab_size, p.temperature, &e);
  TokenDistribution dist;
  if (sum <= 0.0) {  // every token refused: the lowest id, as greedy would pick
    dist.ids = {0};
    dist.probs = {1.0f};
    return dist;
  }
  if (!Truncates(p, vocab_size)) {
    // Nothing to cut: the whole distribution in id order, no sort.
    for (int32_t i = 0; i < vocab_size; ++i) {
      if (e[i] <= 0.0f) continue;
      dist.ids.push_back(i);
      dist.probs.push_back(static_cast<float>(e[i] / sum));
    }
    return dist;
  }
  // Candidates in descending probability, ties by id; only as many sorted as the cuts need.
  std::vector<int32_t> order;
  order.reserve(vocab_size);
  for (int32_t i = 0; i < vocab_size; ++i) {
    if (e[i] > 0.0f) order.push_back(i);
  }
  const ByLogitDesc cmp{logits};
  double mass = sum;  // what top-p measures against: the top-k tokens when top-k is set
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) {
    std::nth_element(order.begin(), order.begin() + p.top_k, order.end(), cmp);
    order.resize(p.top_k);
    mass = 0.0;
    for (int32_t id : order) mass += e[id];
  }
  if (p.min_p > 0.0f) {
    // min-p keeps tokens with at least min_p times the top probability (whose scaled exp is 1):
    // a filter, no order needed.
    size_t kept = 0;
    for (int32_t id : order) {
      if (e[id] >= p.min_p) order[kept++] = id;
    }
    order.resize(kept);
  }
  size_t n = order.size();
  size_t sorted = std::min<size_t>(n, p.top_p < 1.0f ? 64 : n);
  SortPrefix(order.begin(), order.end(), sorted, cmp);
  if (p.top_p < 1.0f) {
    // Grow the sorted prefix until it holds top_p of the mass (or everything kept).
    double cum = 0.0;
    size_t cut = n;
    for (size_t i = 0; i < n; ++i) {
      if (i == sorted) {
        sorted = std::min(n, sorted * 4);
        SortPrefix(order.begin() + i, order.end(), sorted - i, cmp);
      }
      cum += e[order[i]] / mass;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    n = cut;
  }
  dist.ids.assign(order.begin(), order.begin() + n);
  double kept = 0.0;
  for (int32_t id : dist.ids) kept += e[id];
  for (int32_t id : dist.ids) dist.probs.push_back(static_cast<float>(e[id] / kept));
  return dist;
}

int32_t SampleFromDistribution(const TokenDistribution& dist, Rng& rng) {
  return SampleFromDistribution(dist, rng.Uniform());
}

int32_t SampleFromDistribution(const TokenDistribution& dist, double u) {
  double cum = 0.0;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    cum += dist.probs[i];
    if (u < cum) return dist.ids[i];
  }
  return dist.ids.back();  // rounding: u beyond the accumulated sum
}

int32_t SampleToken(const SamplingParams& params, const float* logits, int32_t vocab_size,
                    Rng& rng) {
  if (params.greedy()) return GreedyToken(logits, vocab_size);
  return SampleTokenWithUniform(params, logits, vocab_size, rng.Uniform());
}

int32_t SampleTokenWithUniform(const SamplingParams& params, const float* logits,
                               int32_t vocab_size, double u) {
  if (params.greedy()) return GreedyToken(logits, vocab_size);
  if (Truncates(params, vocab_size)) {
    return SampleFromDistribution(ComputeDistribution(params, logits, vocab_size), u);
  }
  // No truncation: one pass in id order with the uniform scaled by the sum, no sort and no
  // distribution built (ComputeDistribution orders this case the same way).
  std::vector<float> e;
  const double sum = ScaledExp(logits, vocab_size, params.temperature, &e);
  if (sum <= 0.0) return 0;
  const double target = u * sum;
  double cum = 0.0;
  int32_t last = 0;
  for (int32_t i = 0; i < vocab_size; ++i) {
    if (e[i] <= 0.0f) continue;
    cum += e[i];
    if (target < cum) return i;
    last = i;
  }
  return last;  // rounding: the draw beyond the accumulated sum
}

void ComputeLogprobs(const float* logits, int32_t vocab_size, int32_t token, int32_t top_n,
                     TokenLogprob* chosen, std::vector<TokenLogprob>* top) {
  float max_logit = logits[GreedyToken(logits, vocab_size)];
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i)
    sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const float log_z = max_logit + static_cast<float>(std::log(sum));
  chosen->id = token;
  chosen->logprob = logits[token] - log_z;
  top->clear();
  if (top_n <= 0) return;
  std::vector<int32_t> order(vocab_size);
  std::iota(order.begin(), order.end(), 0);
  size_t n = std::min<size_t>(top_n, order.size());
  std::partial_sort(order.begin(), order.begin() + n, order.end(), ByLogitDesc{logits});
  for (size_t i = 0; i < n; ++i) top->push_back({order[i], logits[order[i]] - log_z});
}

}  // namespace tandem
