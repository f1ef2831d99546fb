#pragma once

#include <cstdint>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/thread_pool.h"
#include "common/config/model_config.h"
#include "common/engine/model/model.h"

namespace tandem {

// The mixture-of-experts MLP of one layer on the CPU, batched by expert: the router's logits
// (f32), per token a softmax over all experts, the num_experts_per_tok most likely (ties to the
// lower expert id), renormalised when config.norm_topk_prob; then for each expert that any token
// chose, the rows of its tokens gathered into one matrix and run through the expert's SwiGLU in
// one pass (each expert's weights read once per step); finally each token's output is the sum
// of its experts' outputs times their weights, in ascending expert id. Every step of that is a
// function of the token's own row (the kernels are batch-invariant), so a token's output does
// not depend on which tokens share its batch or its experts.
class MoeMlp {
 public:
  // out[t, hidden] = MoE(h[t, hidden]) for t < num_tokens.
  void Run(const ModelConfig& c, const LayerWeights& lw, const float* h, int64_t num_tokens,
           DType input_dtype, float* out, ThreadPool* pool);

 private:
  std::vector<float> logits_, weights_, gathered_, gate_, up_, act_, expert_out_, slots_;
  std::vector<int32_t> chosen_, offsets_, members_;
};

}  // namespace tandem
