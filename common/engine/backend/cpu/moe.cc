#include "common/engine/backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/weight_view.h"

namespace tandem {
namespace {

template <typename T>
T* Sized(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

void MoeMlp::Run(const ModelConfig& c, const LayerWeights& lw, const float* h, int64_t t,
                 DType input_dtype, float* out, ThreadPool* pool) {
  const int64_t d = c.hidden_size, ef = c.expert_ffn();
  const int64_t num_experts = c.num_experts, k = c.num_experts_per_tok;
  float* logits = Sized(logits_, static_cast<size_t>(t * num_experts));
  cpu::MatMul(h, t, d, d, WeightView(lw.router, DType::kF32), num_experts, nullptr, logits,
              num_experts, pool);

  // Routing: softmax, top-k (stable: ties keep the lower id), optional renormalisation; each
  // token's choices are then ordered by expert id, the order their outputs are summed in.
  int32_t* chosen = Sized(chosen_, static_cast<size_t>(t * k));
  float* weights = Sized(weights_, static_cast<size_t>(t * k));
  std::vector<int32_t> ids(static_cast<size_t>(num_experts));
  std::vector<float> probs(static_cast<size_t>(num_experts));
  for (int64_t i = 0; i < t; ++i) {
    const float* row = logits + i * num_experts;
    const float max = *std::max_element(row, row + num_experts);
    float sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      probs[e] = std::exp(row[e] - max);
      sum += probs[e];
    }
    for (int64_t e = 0; e < num_experts; ++e) probs[e] /= sum;
    for (int64_t e = 0; e < num_experts; ++e) ids[e] = static_cast<int32_t>(e);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    std::sort(ids.begin(), ids.begin() + k);
    float top = 0;
    for (int64_t j = 0; j < k; ++j) top += probs[ids[j]];
    for (int64_t j = 0; j < k; ++j) {
      chosen[i * k + j] = ids[j];
      weights[i * k + j] = c.norm_topk_prob ? probs[ids[j]] / top : probs[ids[j]];
    }
  }

  // Group (token, slot) pairs by expert: offsets_[e] .. offsets_[e + 1] index members_.
  int32_t* offsets = Sized(offsets_, static_cast<size_t>(num_experts + 1));
  std::fill(offsets, offsets + num_experts + 1, 0);
  for (int64_t s = 0; s < t * k; ++s) ++offsets[chosen[s] + 1];
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  int32_t* members = Sized(members_, static_cast<size_t>(t * k));
  {
    std::vector<int32_t> fill(offsets, offsets + num_experts);
    for (int64_t s = 0; s < t * k; ++s) members[fill[chosen[s]]++] = static_cast<int32_t>(s);
  }

  // Each chosen expert once, over the rows of all its tokens; outputs land in their slots.
  float* slots = Sized(slots_, static_cast<size_t>(t * k * d));
  if (RunSharedExperts(c, lw, h, t, offsets, input_dtype, slots, pool)) {
    Combine(weights, slots, t, k, d, out);
    AddSharedExpert(c, lw, h, t, input_dtype, out, pool);
    return;
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const int32_t* group = members + offsets[e];
    float* x = Sized(gathered_, static_cast<size_t>(n * d));
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(x + r * d, h + (group[r] / k) * d, static_cast<size_t>(d) * sizeof(float));
    }
    const ExpertWeights& ew = lw.experts[e];
    float* gate = Sized(gate_, static_cast<size_t>(n * ef));
    float* up = Sized(up_, static_cast<size_t>(n * ef));
    float* act = Sized(act_, static_cast<size_t>(n * ef));
    float* y = Sized(expert_out_, static_cast<size_t>(n * d));
    const cpu::MatMulProjection projections[2] = {
        {WeightView(ew.gate_proj, input_dtype), ef, nullptr, gate, ef},
        {WeightView(ew.up_proj, input_dtype), ef, nullptr, up, ef}};
    cpu::MatMulShared(x, n, d, d, projections, 2, pool);
    cpu::SiluMul(gate, up, n, ef, act, pool);
    cpu::MatMul(act, n, ef, ef, WeightView(ew.down_proj, input_dtype), d, nullptr, y, d, pool);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(slots + static_cast<int64_t>(group[r]) * d, y + r * d,
                  static_cast<size_t>(d) * sizeof(float));
    }
  }
  Combine(weights, slots, t, k, d, out);
  AddSharedExpert(c, lw, h, t, input_dtype, out, pool);
}

void MoeMlp::AddSharedExpert(const ModelConfig& c, const LayerWeights& lw, const float* h,
                             int64_t t, DType input_dtype, float* out, ThreadPool* pool) {
  const int64_t sf = c.shared_expert_intermediate_size, d = c.hidden_size;
  if (sf <= 0) return;
  // Qwen2MoeSparseMoeBlock: out += sigmoid(shared_expert_gate(x)) * shared_expert(x), the gate's
  // logit from f32 weights like the router's.
  float* g = Sized(shared_gate_, static_cast<size_t>(t));
  cpu::MatMul(h, t, d, d, WeightView(lw.shared_expert_gate, DType::kF32), 1, nullptr, g, 1, pool);
  const ExpertWeights& se = lw.shared_expert;
  float* gate = Sized(gate_, static_cast<size_t>(t * sf));
  float* up = Sized(up_, static_cast<size_t>(t * sf));
  float* act = Sized(act_, static_cast<size_t>(t * sf));
  float* y = Sized(expert_out_, static_cast<size_t>(t * d));
  const cpu::MatMulProjection projections[2] = {
      {WeightView(se.gate_proj, input_dtype), sf, nullptr, gate, sf},
      {WeightView(se.up_proj, input_dtype), sf, nullptr, up, sf}};
  cpu::MatMulShared(h, t, d, d, projections, 2, pool);
  cpu::SiluMul(gate, up, t, sf, act, pool);
  cpu::MatMul(act, t, sf, sf, WeightView(se.down_proj, input_dtype), d, nullptr, y, d, pool);
  for (int64_t i = 0; i < t; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    float* o = out + i * d;
    const float* yi = y + i * d;
    for (int64_t x = 0; x < d; ++x) o[x] += s * yi[x];
  }
}

bool MoeMlp::RunSharedExperts(const ModelConfig& c, const LayerWeights& lw, const float* h,
                              int64_t t, const int32_t* offsets, DType input_dtype, float* slots,
                              ThreadPool* pool) {
  const int64_t d = c.hidden_size, ef = c.expert_ffn(), k = c.num_experts_per_tok;
  std::vector<int32_t>& experts = shared_experts_;
  experts.clear();
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    if (n != t) return false;  // tokens differ in their experts: one pass per expert
    experts.push_back(static_cast<int32_t>(e));
  }
  // Every token chose these k experts (always so for a lone token, i.e. batch-1 decode): each
  // token's slot j holds its j-th expert in ascending id, expert j's rows are h itself in token
  // order, and all gate/up projections take that one input in one call. The same kernels over
  // the same rows as the per-expert pass, so the same bits, with one fork/join and one input
  // quantization for all experts' gate/up instead of one per expert.
  const int64_t rows = k * t;  // expert j's rows [j * t, (j + 1) * t)
  float* gate = Sized(gate_, static_cast<size_t>(rows * ef));
  float* up = Sized(up_, static_cast<size_t>(rows * ef));
  float* act = Sized(act_, static_cast<size_t>(rows * ef));
  std::vector<cpu::MatMulProjection>& projections = projections_;
  projections.clear();
  for (int64_t j = 0; j < k; ++j) {
    const ExpertWeights& ew = lw.experts[experts[j]];
    projections.push_back(
        {WeightView(ew.gate_proj, input_dtype), ef, nullptr, gate + j * t * ef, ef});
    projections.push_back({WeightView(ew.up_proj, input_dtype), ef, nullptr, up + j * t * ef, ef});
  }
  cpu::MatMulShared(h, t, d, d, projections.data(), static_cast<int>(projections.size()), pool);
  cpu::SiluMul(gate, up, rows, ef, act, pool);
  for (int64_t j = 0; j < k; ++j) {  // token i's slot j is row i * k + j of slots
    cpu::MatMul(act + j * t * ef, t, ef, ef,
                WeightView(lw.experts[experts[j]].down_proj, input_dtype), d, nullptr,
                slots + j * d, k * d, pool);
  }
  return true;
}

void MoeMlp::Combine(const float* weights, const float* slots, int64_t t, int64_t k, int64_t d,
                     float* out) {
  for (int64_t i = 0; i < t; ++i) {
    float* o = out + i * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights[i * k + j];
      const float* y = slots + (i * k + j) * d;
      for (int64_t x = 0; x < d; ++x) o[x] += w * y[x];
    }
  }
}

}  // namespace tandem
