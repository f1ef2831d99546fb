// The engine sampling on the device (EngineOptions::device_sampling, Backend::ForwardSampled)
// against the same engine sampling every row on the host, over the CUDA backend: greedy requests
// with logit bias, min_tokens, penalties and logprobs give the same tokens and logprobs, seeded
// sampled requests with every cut (and n = 2, whose first token forks on the host) the same
// tokens, and the device path really ran.

#include <map>
#include <string>
#include <vector>

#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::gpu_testing {
namespace {

using ::tandem::testing::Load;
using ::tandem::testing::LoadReference;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
};

std::vector<EngineRequest> Requests(const std::vector<int32_t>& prompt) {
  std::vector<EngineRequest> out;
  auto add = [&](const std::string& id, auto set) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt;
    r.params.max_tokens = 24;
    r.params.ignore_eos = true;
    set(r.params);
    out.push_back(r);
  };
  add("greedy", [](SamplingParams& p) {});
  add("greedy-processed", [](SamplingParams& p) {
    p.logit_bias = {{13, 30.0f}, {5, -2.0f}, {13, 0.5f}};
    p.min_tokens = 4;
    p.ignore_eos = false;
    p.stop_token_ids = {1};
    p.repetition_penalty = 1.5f;
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 1.0f;
    p.logprobs = 3;
  });
  add("sampled-top-p-k", [](SamplingParams& p) {
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.top_k = 20;
    p.seed = 7;
    p.logprobs = 2;
  });
  add("sampled-min-p", [](SamplingParams& p) {
    p.temperature = 1.0f;
    p.min_p = 0.05f;
    p.presence_penalty = 0.3f;
    p.seed = 11;
  });
  add("sampled-plain", [](SamplingParams& p) {
    p.temperature = 1.2f;
    p.seed = 3;
  });
  add("sampled-n2", [](SamplingParams& p) {
    p.temperature = 0.9f;
    p.seed = 5;
  });
  out.back().n = 2;
  return out;
}

// Runs the requests to the end on a fresh engine over the CUDA backend.
std::map<std::string, Output> Generate(bool device_sampling, int64_t* device_rows) {
  const auto ref = LoadReference("stories260k");
  CudaBackendOptions options;
  options.num_blocks = 64;
  options.kv_dtype = DType::kF32;
  options.max_num_tokens = 256;
  options.max_num_seqs = 16;
  options.max_graph_tokens = 16;
  auto model = Load("stories260k", DType::kF32);
  auto backend = cuda::CudaBackend::Create(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return {};
  cuda::CudaBackend* cuda = backend->get();
  EngineOptions engine_options;
  engine_options.device_sampling = device_sampling;
  auto engine = Engine::Create(engine_options, model, std::move(backend).value());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  const std::vector<int32_t> prompt(ref.sequence.begin(), ref.sequence.begin() + ref.prompt_len);
  for (const EngineRequest& r : Requests(prompt)) EXPECT_TRUE((*engine)->AddRequest(r).ok());
  std::map<std::string, Output> out;
  while ((*engine)->HasWork()) {
    for (const SequenceUpdate& u : (*engine)->Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      Output& o = out[u.request_id + "/" + std::to_string(u.index)];
      o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      o.logprobs.insert(o.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    }
  }
  *device_rows = cuda->device_sampled_rows();
  return out;
}

TEST(CudaEngineSamplingTest, DeviceSamplingGivesTheHostSamplersTokens) {
  TANDEM_REQUIRE_GPU();
  int64_t host_device_rows = -1, device_rows = -1;
  const auto host = Generate(false, &host_device_rows);
  const auto device = Generate(true, &device_rows);
  EXPECT_EQ(host_device_rows, 0);
  ASSERT_EQ(host.size(), 7u);
  // Every token but the first of the n = 2 request's two samples (forked on the host) came from
  // the device.
  int64_t tokens = 0;
  for (const auto& [id, out] : device) tokens += static_cast<int64_t>(out.tokens.size());
  EXPECT_EQ(device_rows, tokens - 2);
  ASSERT_EQ(device.size(), host.size());
  for (const auto& [id, want] : host) {
    const Output& got = device.at(id);
    // Seeded draws use the same uniforms on both paths: they differ only when one lands within
    // rounding of a boundary of the cumulative sum (about 1e-7 per token).
    EXPECT_EQ(got.tokens, want.tokens) << id;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << id;
    for (size_t i = 0; i < want.logprobs.size() && got.tokens == want.tokens; ++i) {
      EXPECT_EQ(got.logprobs[i].chosen.id, want.logprobs[i].chosen.id);
      EXPECT_NEAR(got.logprobs[i].chosen.logprob, want.logprobs[i].chosen.logprob, 1e-5) << id;
      ASSERT_EQ(got.logprobs[i].top.size(), want.logprobs[i].top.size()) << id;
      for (size_t j = 0; j < want.logprobs[i].top.size(); ++j) {
        EXPECT_EQ(got.logprobs[i].top[j].id, want.logprobs[i].top[j].id) << id;
        EXPECT_NEAR(got.logprobs[i].top[j].logprob, want.logprobs[i].top[j].logprob, 1e-5) << id;
      }
    }
  }
  // The processing changed the greedy tokens (so the comparison above covers it).
  EXPECT_NE(host.at("greedy/0").tokens, host.at("greedy-processed/0").tokens);
}

}  // namespace
}  // namespace tandem::gpu_testing
