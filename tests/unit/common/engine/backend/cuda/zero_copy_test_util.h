#pragma once

// Shared by the zero-copy tests on the emulated CUDA backend (cuda_engine_zero_copy_emulated_test,
// prefill_core_zero_copy_emulated_test): a second device pool standing in for a decode worker's
// pool mapped by cuda-ipc, an engine on the emulated backend, and the copying path's KV to
// compare against.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing::zero_copy {

inline constexpr int64_t kRemoteBlocks = 24;
inline constexpr uint8_t kFill = 0xAB;

// A second pool of the engine's region layout, `kRemoteBlocks` blocks per layer, filled with
// kFill; freed with the last reference to it.
inline std::shared_ptr<RemoteKvPool> MakeRemotePool(const KvCacheSpec& spec) {
  const size_t region = spec.bytes_per_block_layer();
  const size_t bytes = region * kRemoteBlocks * spec.num_layers;
  void* mem = nullptr;
  EXPECT_EQ(cudaMalloc(&mem, bytes), cudaSuccess);
  std::vector<uint8_t> fill(bytes, kFill);
  EXPECT_EQ(cudaMemcpy(mem, fill.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  auto pool = std::make_shared<RemoteKvPool>();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    pool->layer_base.push_back(static_cast<uint8_t*>(mem) + l * kRemoteBlocks * region);
  }
  pool->num_blocks = kRemoteBlocks;
  pool->mapping = std::shared_ptr<void>(mem, [](void* p) { cudaFree(p); });
  return pool;
}

inline std::vector<uint8_t> RemoteRegion(const RemoteKvPool& pool, const KvCacheSpec& spec,
                                         int64_t layer, int32_t block) {
  const size_t region = spec.bytes_per_block_layer();
  std::vector<uint8_t> out(region);
  EXPECT_EQ(cudaMemcpy(out.data(), pool.layer_base[layer] + block * region, region,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

// Allocation faults with `alloc_fail_prob`; each step first stalls `stall_ms`.
inline std::unique_ptr<Engine> MakeCudaEngine(int64_t num_blocks, int64_t batched_tokens,
                                              double alloc_fail_prob = 0, int64_t stall_ms = 0) {
  std::shared_ptr<const Model> model = ::tandem::testing::Load("stories260k", DType::kF32);
  CudaBackendOptions options;
  options.num_blocks = num_blocks;
  options.kv_dtype = DType::kF32;
  options.max_num_tokens = 256;
  options.max_num_seqs = 16;
  options.max_graph_tokens = 16;
  auto backend = CreateCudaBackend(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return nullptr;
  EngineOptions engine_options;
  engine_options.scheduler.max_num_batched_tokens = batched_tokens;
  engine_options.scheduler.max_num_seqs = 16;
  engine_options.faults_from_env = false;
  engine_options.faults.alloc_fail_prob = alloc_fail_prob;
  engine_options.faults.stall_ms = stall_ms;
  engine_options.faults.seed = 5;
  auto engine = Engine::Create(engine_options, model, *std::move(backend));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

inline std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  while (static_cast<int>(p.size()) < n)
    p.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
  return p;
}

// The KV of one prefill: [layer][block of the prompt from first_block on] region bytes, and
// the first token.
struct PrefillKv {
  std::vector<std::vector<std::vector<uint8_t>>> regions;
  int32_t first_token = -1;
  int32_t num_preemptions = 0;
  int64_t cached_tokens = 0;
};

inline EngineRequest PrefillRequest(const std::string& id, const std::vector<int32_t>& prompt) {
  EngineRequest r;
  r.id = id;
  r.prompt = prompt;
  r.params.max_tokens = 1;
  r.prefill_only = true;
  return r;
}

// Runs the engine until every request in `want` finished; their finishing updates by id.
inline std::map<std::string, SequenceUpdate> RunUntilDone(Engine& engine, size_t want) {
  std::map<std::string, SequenceUpdate> done;
  std::map<std::string, int32_t> first;
  for (int guard = 0; done.size() < want && guard < 10000; ++guard) {
    for (SequenceUpdate& u : engine.Step()) {
      if (!u.new_tokens.empty()) first[u.request_id] = u.new_tokens[0];
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.request_id << ": " << u.status;
        if (first.count(u.request_id)) u.new_tokens = {first[u.request_id]};
        done[u.request_id] = std::move(u);
      }
    }
  }
  EXPECT_EQ(done.size(), want);
  return done;
}

// The copying path: the prompt prefilled into the engine's own blocks, read back from there.
inline PrefillKv CopyingPrefill(const std::vector<int32_t>& prompt, int64_t first_block) {
  auto engine = MakeCudaEngine(32, 32);
  PrefillKv kv;
  if (engine == nullptr) return kv;
  EXPECT_TRUE(engine->AddRequest(PrefillRequest("ref", prompt)).ok());
  const SequenceUpdate u = RunUntilDone(*engine, 1).at("ref");
  kv.first_token = u.new_tokens.empty() ? -1 : u.new_tokens[0];
  const KvCacheSpec& spec = engine->backend().kv_spec();
  kv.regions.resize(spec.num_layers);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    for (size_t i = first_block; i < u.held_blocks.size(); ++i) {
      std::vector<uint8_t> region(spec.bytes_per_block_layer());
      EXPECT_TRUE(engine->backend().ReadBlockRegion(l, u.held_blocks[i], region.data()).ok());
      kv.regions[l].push_back(std::move(region));
    }
  }
  engine->ReleaseHold("ref");
  return kv;
}

inline std::shared_ptr<KvDestination> Destination(const std::shared_ptr<RemoteKvPool>& pool,
                                                  int64_t first_block,
                                                  std::vector<int32_t> blocks) {
  auto d = std::make_shared<KvDestination>();
  d->first_block = first_block;
  d->blocks = std::move(blocks);
  d->pool = pool;
  return d;
}

// What the destination's blocks hold after the prefill.
inline PrefillKv ReadDestination(const KvDestination& d, const KvCacheSpec& spec) {
  PrefillKv kv;
  kv.regions.resize(spec.num_layers);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    for (int32_t b : d.blocks) kv.regions[l].push_back(RemoteRegion(*d.pool, spec, l, b));
  }
  return kv;
}

// The KV of the written positions: every row of the full blocks, the first `tail_rows` rows of
// the last block (the rest of a block is never written nor read, and pools start with different
// bytes there). F32 KV: [2][kv_heads][block_size][head_dim] per region. `tolerance` 0: bit for
// bit; else each value within tolerance * the region's largest |value| (the CUDA backend's
// products take another path below 9 rows, so a chunk batched differently rounds differently).
inline void ExpectSameKv(const PrefillKv& got, const PrefillKv& want, const KvCacheSpec& spec,
                         int64_t tail_rows, const std::string& what, double tolerance = 0) {
  ASSERT_EQ(got.regions.size(), want.regions.size()) << what;
  const int64_t d = spec.head_dim;
  for (size_t l = 0; l < want.regions.size(); ++l) {
    ASSERT_EQ(got.regions[l].size(), want.regions[l].size()) << what;
    for (size_t i = 0; i < want.regions[l].size(); ++i) {
      const bool last = i + 1 == want.regions[l].size();
      const int64_t rows = last && tail_rows > 0 ? tail_rows : spec.block_size;
      const float* g = reinterpret_cast<const float*>(got.regions[l][i].data());
      const float* w = reinterpret_cast<const float*>(want.regions[l][i].data());
      double max_diff = 0, max_ref = 0;
      bool same = true;
      for (int64_t kh = 0; kh < 2 * spec.num_kv_heads; ++kh) {
        for (int64_t k = kh * spec.block_size * d; k < (kh * spec.block_size + rows) * d; ++k) {
          same = same && std::memcmp(&g[k], &w[k], sizeof(float)) == 0;
          max_diff = std::max(max_diff, std::fabs(static_cast<double>(g[k]) - w[k]));
          max_ref = std::max(max_ref, std::fabs(static_cast<double>(w[k])));
        }
      }
      if (tolerance == 0) {
        EXPECT_TRUE(same) << what << ": layer " << l << ", block " << i << " differs";
      } else {
        EXPECT_LE(max_diff, tolerance * max_ref) << what << ": layer " << l << ", block " << i;
      }
    }
  }
}

// Every block of the pool outside `used` still holds kFill.
inline void ExpectUntouched(const RemoteKvPool& pool, const KvCacheSpec& spec,
                            const std::vector<int32_t>& used) {
  for (int32_t b = 0; b < kRemoteBlocks; ++b) {
    if (std::find(used.begin(), used.end(), b) != used.end()) continue;
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      const std::vector<uint8_t> r = RemoteRegion(pool, spec, l, b);
      EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](uint8_t x) { return x == kFill; }))
          << "remote block " << b << " layer " << l << " was written";
    }
  }
}

}  // namespace tandem::testing::zero_copy
