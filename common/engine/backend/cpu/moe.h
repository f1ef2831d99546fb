#pragma once

#include <cstdint>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/thread_pool.h"
#include "common/config/model_config.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/model.h"

namespace tandem {

// The mixture-of-experts MLP of one layer on the CPU, batched by expert: the router's logits
// (f32), per token a softmax over all experts, the num_experts_per_tok most likely (ties to the
// lower expert id), renormalised when config.norm_topk_prob; then for each expert that any token
// chose, the rows of its tokens gathered into one matrix and run through the expert's SwiGLU in
// one pass (each expert's weights read once per step; when every token chose the same experts,
// as a lone token always does, all their gate/up projections in one call); finally each token's
// output is the sum of its experts' outputs times their weights, in ascending expert id. Every step
// of that is a function of the token's own row (the kernels are batch-invariant), so a token's
// output does not depend on which tokens share its batch or its experts. Qwen2-MoE's shared
// expert then runs over every token's row and adds its gated output (AddSharedExpert).
class MoeMlp {
 public:
  // out[t, hidden] = MoE(h[t, hidden]) for t < num_tokens.
  void Run(const ModelConfig& c, const LayerWeights& lw, const float* h, int64_t num_tokens,
           DType input_dtype, float* out, ThreadPool* pool);

 private:
  // When every token chose the same experts (always for one token): all their gate/up
  // projections in one MatMulShared call, outputs straight into `slots`; false otherwise.
  bool RunSharedExperts(const ModelConfig& c, const LayerWeights& lw, const float* h, int64_t t,
                        const int32_t* offsets, DType input_dtype, float* slots, ThreadPool* pool);
  // Qwen2-MoE (config.shared_expert_intermediate_size > 0): out[t] += sigmoid(shared gate
  // logit) * shared expert's SwiGLU output, after the routed experts' sum; else nothing.
  void AddSharedExpert(const ModelConfig& c, const LayerWeights& lw, const float* h, int64_t t,
                       DType input_dtype, float* out, ThreadPool* pool);
  // out[i] = sum over j of weights[i, j] * slots[i, j] in slot order (ascending expert id).
  static void Combine(const float* weights, const float* slots, int64_t t, int64_t k, int64_t d,
                      float* out);

  std::vector<float> logits_, weights_, gathered_, gate_, up_, act_, expert_out_, slots_,
      shared_gate_;
  std::vector<int32_t> chosen_, offsets_, members_, shared_experts_;
  std::vector<cpu::MatMulProjection> projections_;
};

}  // namespace tandem
