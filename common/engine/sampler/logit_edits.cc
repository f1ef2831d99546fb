#include "common/engine/sampler/logit_edits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace tandem {

void BuildLogitEdits(const SamplingParams& p, const TokenHistory& history,
                     absl::Span<const int32_t> stop_ids, int32_t vocab_size, LogitEdits* out) {
  out->edits.clear();
  out->phase_end.clear();
  auto end_phase = [out] {
    const int32_t n = static_cast<int32_t>(out->edits.size());
    if (n > (out->phase_end.empty() ? 0 : out->phase_end.back())) out->phase_end.push_back(n);
  };
  auto in_vocab = [vocab_size](int32_t id) { return id >= 0 && id < vocab_size; };
  // Logit bias in its order; a token named again starts a new phase (the additions stay in
  // order).
  {
    std::unordered_map<int32_t, int32_t> times;  // of each token so far: its phase
    std::vector<std::vector<LogitEdit>> phases;
    for (const auto& [id, bias] : p.logit_bias) {
      if (!in_vocab(id)) continue;
      const int32_t k = times[id]++;
      if (static_cast<size_t>(k) >= phases.size()) phases.resize(k + 1);
      phases[k].push_back({id, LogitOp::kAdd, bias});
    }
    for (const auto& phase : phases) {
      out->edits.insert(out->edits.end(), phase.begin(), phase.end());
      end_phase();
    }
  }
  if (static_cast<int32_t>(history.output.size()) < p.min_tokens) {
    std::vector<int32_t> ids;
    for (int32_t id : stop_ids) {
      if (in_vocab(id) && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    for (int32_t id : ids) out->edits.push_back({id, LogitOp::kNegInf, 0.0f});
    end_phase();
  }
  if (p.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab_size, false);
    auto penalize = [&](int32_t id) {
      if (!in_vocab(id) || seen[id]) return;
      seen[id] = true;
      out->edits.push_back({id, LogitOp::kRepetition, p.repetition_penalty});
    };
    for (int32_t id : history.prompt) penalize(id);
    for (int32_t id : history.output) penalize(id);
    end_phase();
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t id : history.output) ++counts[id];
    for (const auto& [id, count] : counts) {
      if (!in_vocab(id)) continue;
      const float delta = p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
      out->edits.push_back({id, LogitOp::kSubtract, delta});
    }
    end_phase();
  }
}

void ApplyLogitEdits(const LogitEdits& edits, float* logits) {
  for (const LogitEdit& e : edits.edits) logits[e.id] = ApplyLogitEdit(e.op, e.value, logits[e.id]);
}

void ApplyTokenMask(const TokenMaskEdit& mask, float* logits, int32_t vocab_size) {
  if (mask.allowed.empty()) return;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int32_t words = static_cast<int32_t>(mask.allowed.size());
  // Word at a time: a refused word is one fill, a partial word visits only its refused bits.
  for (int32_t w = 0; w * 64 < vocab_size; ++w) {
    const int32_t base = w * 64;
    const int32_t n = std::min(64, vocab_size - base);
    const uint64_t word = w < words ? mask.allowed[w] : 0;
    const uint64_t in_range = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    if (word == 0) {
      std::fill(logits + base, logits + base + n, kNegInf);
      continue;
    }
    for (uint64_t refused = ~word & in_range; refused != 0; refused &= refused - 1) {
      logits[base + __builtin_ctzll(refused)] = kNegInf;
    }
  }
  for (int32_t id : mask.revive) {
    if (id >= 0 && id < vocab_size && !std::isfinite(logits[id])) logits[id] = 0.0f;
  }
}

}  // namespace tandem
