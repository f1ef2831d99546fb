// KV cache tiers (common/engine/tier_feature.h) on the emulated CUDA backend, whose pool is device
// memory: blocks leave the pool and come back through asynchronous copies (Backend::StartBlockRead
// / StartBlockWrite) rather than synchronous region reads and writes. Deferred streams (the
// emulator runs a stream's work only when the host waits for it) and the overlapped engine loop:
// a copy-out the host read before it landed, or an install that was not ordered before the
// forward pass reading it, would change tokens; a copy that waited for the stream shows as a
// stream synchronization.

#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem {
namespace {

struct Chat {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // [turn][session]
  EngineStats stats;
  int64_t stream_syncs = 0;  // while the engine stepped
};

// `sessions` multi-turn chats whose histories (about 4x the pool) compete for a 24-block pool;
// turn t of every session runs together; each turn adds 24 user tokens to the last answer.
Chat RunChat(bool tiers, int sessions = 6, int turns = 5) {
  cuda_emu::SetDeferredStreams(true);
  Chat chat;
  std::shared_ptr<const Model> model = testing::Load("stories260k", DType::kF32);
  CudaBackendOptions options;
  options.num_blocks = 24;
  options.kv_dtype = DType::kF32;
  options.max_num_tokens = 512;
  options.max_num_seqs = 16;
  options.max_graph_tokens = 16;
  auto backend = cuda::CudaBackend::Create(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return chat;
  EngineOptions engine_options;
  engine_options.async_scheduling = true;
  engine_options.scheduler.max_num_batched_tokens = 256;
  engine_options.scheduler.max_num_seqs = 16;
  if (tiers) {
    engine_options.kv_tiers.host_bytes = 32 << 20;
    engine_options.kv_tiers.fingerprint = 1;
  }
  auto engine = Engine::Create(engine_options, model, *std::move(backend));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return chat;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> history(sessions, std::vector<int32_t>{1});
  const int64_t syncs_before = cuda_emu::StreamSyncs();
  for (int t = 0; t < turns; ++t) {
    for (int s = 0; s < sessions; ++s) {
      for (int k = 0; k < 24; ++k) {
        history[s].push_back(std::uniform_int_distribution<int>(3, 511)(rng));
      }
      EngineRequest r;
      r.id = std::to_string(s);
      r.prompt = history[s];
      r.params.max_tokens = 12;
      r.params.ignore_eos = true;
      EXPECT_TRUE((*engine)->AddRequest(r).ok());
    }
    std::vector<std::vector<int32_t>> answers(sessions);
    int finished = 0, guard = 0;
    while (finished < sessions && ++guard < 100000) {
      if (!(*engine)->HasWork()) {
        absl::SleepFor(absl::Microseconds(200));  // a load from the tiers in flight
        continue;
      }
      for (const SequenceUpdate& u : (*engine)->Step()) {
        auto& a = answers[std::stoi(u.request_id)];
        a.insert(a.end(), u.new_tokens.begin(), u.new_tokens.end());
        if (u.finished) {
          EXPECT_TRUE(u.status.ok()) << u.status;
          ++finished;
        }
      }
    }
    EXPECT_EQ(finished, sessions);
    for (int s = 0; s < sessions; ++s) {
      history[s].insert(history[s].end(), answers[s].begin(), answers[s].end());
    }
    chat.tokens.push_back(std::move(answers));
  }
  chat.stream_syncs = cuda_emu::StreamSyncs() - syncs_before;
  chat.stats = (*engine)->stats();
  return chat;
}

// Greedy output is the same with the tiers on and off; turns found their history in the host
// tier (blocks copied out at eviction and installed back), and no copy waited for the device.
TEST(CudaEngineTiersTest, AsynchronousCopiesGiveTheSameTokensWithoutWaiting) {
  const Chat off = RunChat(false);
  const Chat on = RunChat(true);
  ASSERT_EQ(on.tokens.size(), off.tokens.size());
  for (size_t t = 0; t < off.tokens.size(); ++t) {
    EXPECT_EQ(on.tokens[t], off.tokens[t]) << "turn " << t;
  }
  const KvTierStats& tiers = on.stats.kv_tiers;
  EXPECT_GT(tiers.tier[0].bytes_in, 0);  // copied out at eviction
  EXPECT_GT(tiers.loaded_blocks, 10);    // and installed back
  EXPECT_EQ(tiers.write_drops, 0);
  EXPECT_EQ(on.stream_syncs, 0);
  EXPECT_EQ(off.stream_syncs, 0);
  EXPECT_GT(on.stats.overlapped_steps, 5);
}

}  // namespace
}  // namespace tandem
