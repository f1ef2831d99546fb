#include "common/engine/spec/verifier.h"

#include <algorithm>
#include <unordered_map>

namespace tandem {

VerifyResult VerifyPosition(const SamplingParams& params, const float* logits, int32_t vocab_size,
                            int32_t draft_token, const TokenDistribution* q, Rng& rng,
                            bool testing_always_accept) {
  VerifyResult r;
  if (draft_token >= 0 && testing_always_accept) {
    r.token = draft_token;
    r.accepted = true;
    return r;
  }
  if (params.greedy()) {
    r.token = GreedyToken(logits, vocab_size);
    r.accepted = draft_token >= 0 && r.token == draft_token;
    return r;
  }
  TokenDistribution p = ComputeDistribution(params, logits, vocab_size);
  if (draft_token < 0) {
    r.token = SampleFromDistribution(p, rng);
    return r;
  }
  const double px = p.ProbOf(draft_token);
  const double qx = q != nullptr ? q->ProbOf(draft_token) : 1.0;
  const double u = rng.Uniform();
  if (qx > 0 && u * qx < px) {  // u < min(1, px / qx)
    r.token = draft_token;
    r.accepted = true;
    return r;
  }
  // Rejected: the residual max(0, p - q), in p's order (deterministic given the draw).
  std::unordered_map<int32_t, float> qmap;
  if (q != nullptr) {
    for (size_t i = 0; i < q->ids.size(); ++i) qmap[q->ids[i]] = q->probs[i];
  } else {
    qmap[draft_token] = 1.0f;
  }
  TokenDistribution residual;
  double total = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    auto it = qmap.find(p.ids[i]);
    const double diff = p.probs[i] - (it == qmap.end() ? 0.0 : it->second);
    if (diff <= 0) continue;
    residual.ids.push_back(p.ids[i]);
    residual.probs.push_back(static_cast<float>(diff));
    total += diff;
  }
  if (total <= 0) {  // p == q up to rounding: rejection had probability 0
    r.token = SampleFromDistribution(p, rng);
    return r;
  }
  for (float& v : residual.probs) v = static_cast<float>(v / total);
  r.token = SampleFromDistribution(residual, rng);
  return r;
}

}  // namespace tandem
