#pragma once

// Shared by the engine tests: random greedy workloads and a loop that runs them to completion.

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem::testing_util {

// An engine on the bundled model (models/stories260k) with `blocks` KV blocks, one compute thread.
inline std::unique_ptr<Engine> MakeBundledEngine(int64_t blocks) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = blocks;
  b.show_progress = false;
  b.threads = 1;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? std::move(built->engine) : nullptr;
}

struct Req {
  std::vector<int32_t> prompt;
  int32_t max_tokens;
};

// n requests: BOS + 1..max_prompt random ids in [3, 511], max_tokens in 1..max_new.
inline std::vector<Req> MakeRequests(int n, uint32_t seed, int max_prompt, int max_new) {
  std::mt19937 rng(seed);
  std::vector<Req> out;
  for (int i = 0; i < n; ++i) {
    Req r;
    r.prompt.push_back(1);
    const int len = std::uniform_int_distribution<int>(1, max_prompt)(rng);
    for (int k = 0; k < len; ++k) {
      r.prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    }
    r.max_tokens = std::uniform_int_distribution<int>(1, max_new)(rng);
    out.push_back(std::move(r));
  }
  return out;
}

// Runs requests to completion; returns tokens per (request, sample).
inline std::map<std::string, std::vector<int32_t>> RunAll(Engine& engine,
                                                          const std::vector<Req>& reqs,
                                                          int32_t n = 1, float temperature = 0) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = reqs[i].prompt;
    r.params.max_tokens = reqs[i].max_tokens;
    r.params.ignore_eos = true;
    r.params.temperature = temperature;
    r.params.seed = 100 + i;
    r.n = n;
    EXPECT_TRUE(engine.AddRequest(r).ok());
  }
  std::map<std::string, std::vector<int32_t>> out;
  int finished = 0;
  while (engine.HasWork()) {
    for (const SequenceUpdate& u : engine.Step()) {
      auto& v = out[u.request_id + "/" + std::to_string(u.index)];
      v.insert(v.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.status;
        EXPECT_EQ(u.finish_reason, FinishReason::kLength);
        ++finished;
      }
    }
  }
  EXPECT_EQ(finished, static_cast<int>(reqs.size()) * n);
  return out;
}

}  // namespace tandem::testing_util
