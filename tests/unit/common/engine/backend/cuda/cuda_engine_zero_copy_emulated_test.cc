// Zero-copy KV destinations (common/engine/zero_copy_feature.h) on the emulated CUDA backend: a
// prefill-only request writes its prompt's KV from a first block on straight into a second pool
// (a device allocation standing in for a decode worker's pool mapped by cuda-ipc), through
// block ids tagged kKvRemoteBlock. The KV there must be bit-identical to what the copying path
// leaves in this engine's own blocks, and this engine's pool, free list and prefix cache must
// never see a destination block (preemption and aborts included).

#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cuda/zero_copy_test_util.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"

namespace tandem {
namespace {

using testing::zero_copy::CopyingPrefill;
using testing::zero_copy::Destination;
using testing::zero_copy::ExpectSameKv;
using testing::zero_copy::ExpectUntouched;
using testing::zero_copy::MakeCudaEngine;
using testing::zero_copy::MakeRemotePool;
using testing::zero_copy::PrefillKv;
using testing::zero_copy::PrefillRequest;
using testing::zero_copy::Prompt;
using testing::zero_copy::ReadDestination;
using testing::zero_copy::RunUntilDone;

// A 70-token prompt (5 blocks of 16, the last partial) in chunks of 32: every destination
// block is written by some chunk, the chunks' attention reads the blocks of earlier chunks in
// the remote pool and, with first_block > 0, this engine's own blocks before it.
TEST(CudaEngineZeroCopyTest, KvInTheDestinationIsTheCopyingPathsAndThePoolNeverSeesIt) {
  const std::vector<int32_t> prompt = Prompt(70, 3);
  for (int64_t first_block : {0, 2}) {
    for (bool warm : {false, true}) {
      if (first_block == 0 && warm) continue;
      SCOPED_TRACE(::testing::Message() << "first_block " << first_block << (warm ? " warm" : ""));
      const PrefillKv want = CopyingPrefill(prompt, first_block);
      auto engine = MakeCudaEngine(32, 32);
      ASSERT_NE(engine, nullptr);
      const KvCacheSpec& spec = engine->backend().kv_spec();
      if (warm) {  // blocks 0 and 1 cached by an earlier prompt with the same start
        std::vector<int32_t> start(prompt.begin(), prompt.begin() + 40);
        EngineRequest r = PrefillRequest("warm", start);
        r.prefill_only = false;
        ASSERT_TRUE(engine->AddRequest(r).ok());
        RunUntilDone(*engine, 1);
      }
      const int64_t cached_before = engine->stats().kv_blocks_cached;
      auto pool = MakeRemotePool(spec);
      std::vector<int32_t> blocks = {17, 3, 9, 11, 0};
      blocks.erase(blocks.begin() + (5 - first_block), blocks.end());
      auto d = Destination(pool, first_block, blocks);
      EngineRequest r = PrefillRequest("zc", prompt);
      r.kv_destination = d;
      ASSERT_TRUE(engine->AddRequest(r).ok());
      const SequenceUpdate u = RunUntilDone(*engine, 1).at("zc");
      EXPECT_EQ(u.cached_tokens, warm ? 32 : 0);
      ASSERT_FALSE(u.new_tokens.empty());
      EXPECT_EQ(u.new_tokens[0], want.first_token);
      ExpectSameKv(ReadDestination(*d, spec), want, spec, 70 % 16, "destination");
      ExpectUntouched(*pool, spec, blocks);
      // Held for export: the local blocks only.
      EngineStats s = engine->stats();
      EXPECT_EQ(s.kv_blocks_used, first_block);
      EXPECT_EQ(s.kv_blocks_held, first_block);
      engine->ReleaseHold("zc");
      s = engine->stats();
      EXPECT_EQ(s.kv_blocks_used, 0);
      EXPECT_EQ(engine->block_pool().num_available(), 32);
      // Only the local full blocks entered the prefix cache.
      EXPECT_EQ(s.kv_blocks_cached, warm ? cached_before : first_block);
    }
  }
}

// Requests for two destinations (and a copying one) at once: no step mixes two remote pools
// (the feature holds the other destination's sequences a step), and every KV lands right.
TEST(CudaEngineZeroCopyTest, TwoDestinationsNeverShareAStep) {
  const std::vector<int32_t> prompt_a = Prompt(70, 5), prompt_b = Prompt(50, 6);
  const PrefillKv want_a = CopyingPrefill(prompt_a, 0), want_b = CopyingPrefill(prompt_b, 1);
  auto engine = MakeCudaEngine(32, 64);
  ASSERT_NE(engine, nullptr);
  const KvCacheSpec& spec = engine->backend().kv_spec();
  auto pool_a = MakeRemotePool(spec), pool_b = MakeRemotePool(spec);
  auto da = Destination(pool_a, 0, {4, 5, 6, 7, 8});
  auto db = Destination(pool_b, 1, {2, 1, 0});
  EngineRequest a = PrefillRequest("a", prompt_a);
  a.kv_destination = da;
  EngineRequest b = PrefillRequest("b", prompt_b);
  b.kv_destination = db;
  EngineRequest c = PrefillRequest("c", Prompt(40, 7));
  ASSERT_TRUE(engine->AddRequest(a).ok());
  ASSERT_TRUE(engine->AddRequest(b).ok());
  ASSERT_TRUE(engine->AddRequest(c).ok());
  const auto done = RunUntilDone(*engine, 3);
  EXPECT_EQ(done.at("a").new_tokens[0], want_a.first_token);
  EXPECT_EQ(done.at("b").new_tokens[0], want_b.first_token);
  ExpectSameKv(ReadDestination(*da, spec), want_a, spec, 70 % 16, "a");
  ExpectSameKv(ReadDestination(*db, spec), want_b, spec, 50 % 16, "b");
  for (const char* id : {"a", "b", "c"}) engine->ReleaseHold(id);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->stats().num_awaiting_kv, 0);
  EXPECT_EQ(engine->block_pool().num_available(), 32);
}

// Allocation faults preempt running sequences (the one served last): zero-copy requests among
// them are preempted and recomputed into the same destination; an abort mid-prefill frees only
// local blocks. The pool ends with every block back and none of the destinations' ids.
TEST(CudaEngineZeroCopyTest, PreemptionAndAbortNeverFreeDestinationBlocks) {
  constexpr int64_t kPoolBlocks = 8;
  const std::vector<int32_t> prompt = Prompt(70, 9);
  const PrefillKv want = CopyingPrefill(prompt, 1);
  auto engine = MakeCudaEngine(kPoolBlocks, 16, /*alloc_fail_prob=*/0.3);
  ASSERT_NE(engine, nullptr);
  const KvCacheSpec& spec = engine->backend().kv_spec();
  std::vector<std::shared_ptr<KvDestination>> dests;
  int next_remote = 0;
  for (int i = 0; i < 3; ++i) {  // copying requests that decode, served first
    EngineRequest r = PrefillRequest("copy" + std::to_string(i), Prompt(20, 20 + i));
    r.prefill_only = false;
    r.params.max_tokens = 40;
    r.params.ignore_eos = true;
    ASSERT_TRUE(engine->AddRequest(r).ok());
  }
  auto pool = MakeRemotePool(spec);
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> blocks;
    for (int k = 0; k < 4; ++k) blocks.push_back(next_remote++);
    dests.push_back(Destination(pool, 1, blocks));
    EngineRequest r = PrefillRequest("zc" + std::to_string(i), prompt);
    r.kv_destination = dests.back();
    ASSERT_TRUE(engine->AddRequest(r).ok());
  }
  // zc3 is aborted after its first chunk was computed (or at once if it never ran).
  std::map<std::string, SequenceUpdate> done;
  std::map<std::string, std::vector<int32_t>> first;
  bool aborted = false;
  for (int guard = 0; done.size() < 7 && guard < 20000; ++guard) {
    for (SequenceUpdate& u : engine->Step()) {
      if (!u.new_tokens.empty()) first[u.request_id] = u.new_tokens;
      if (u.finished) done[u.request_id] = std::move(u);
    }
    if (!aborted && engine->stats().steps >= 6) {
      engine->AbortRequest("zc3");
      aborted = true;
    }
  }
  ASSERT_EQ(done.size(), 7u);
  int32_t zero_copy_preemptions = 0;
  for (int i = 0; i < 3; ++i) {
    const SequenceUpdate& u = done.at("zc" + std::to_string(i));
    EXPECT_TRUE(u.status.ok()) << u.status;
    zero_copy_preemptions += u.num_preemptions;
    EXPECT_EQ(first[u.request_id], std::vector<int32_t>{want.first_token}) << u.request_id;
    // Batched with decodes, in other chunks than the reference: the same values up to the
    // rounding of the products' other path (bit-identity is the cases above, batched alike).
    ExpectSameKv(ReadDestination(*dests[i], spec), want, spec, 70 % 16, u.request_id, 1e-5);
  }
  EXPECT_EQ(done.at("zc3").finish_reason, FinishReason::kAbort);
  EXPECT_GT(zero_copy_preemptions, 0) << "no zero-copy request was preempted";
  for (const auto& [id, u] : done) engine->ReleaseHold(id);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.kv_blocks_held, 0);
  EXPECT_EQ(engine->block_pool().num_available(), kPoolBlocks);
}

// Refused where it cannot be honoured: the CPU backend has no remote pools; a destination that
// does not cover the prompt, or a request that is not prefill-only.
TEST(CudaEngineZeroCopyTest, RefusedWithAClearError) {
  const std::vector<int32_t> prompt = Prompt(40, 11);  // 3 blocks
  auto cpu = testing_util::MakeBundledEngine(16);
  ASSERT_NE(cpu, nullptr);
  auto remote = std::make_shared<RemoteKvPool>();
  remote->layer_base.assign(cpu->backend().kv_spec().num_layers,
                            reinterpret_cast<uint8_t*>(uintptr_t{4096}));
  remote->num_blocks = 8;
  EngineRequest r = PrefillRequest("x", prompt);
  r.kv_destination = Destination(remote, 0, {0, 1, 2});
  absl::Status st = cpu->AddRequest(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("writes no remote KV pool"), std::string::npos) << st;

  auto engine = MakeCudaEngine(16, 32);
  ASSERT_NE(engine, nullptr);
  r.kv_destination = Destination(remote, 1, {0, 1, 2});  // 4 blocks for a 3-block prompt
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.kv_destination = Destination(remote, 0, {0, 1, 8});  // outside the pool
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.kv_destination = Destination(remote, 0, {0, 1, 2});
  r.prefill_only = false;
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
}

// ValidateForwardBatch: a tagged id only with a remote pool, and inside it.
TEST(CudaEngineZeroCopyTest, ValidateForwardBatchChecksTaggedIds) {
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.block_size = 4;
  spec.num_blocks = 4;
  ForwardBatch b;
  b.AddSequence({5, 6, 7, 8, 9}, 0, {1, kKvRemoteBlock + 2}, spec.block_size, true);
  EXPECT_FALSE(ValidateForwardBatch(b, spec, 100, 64).ok());
  auto remote = std::make_shared<RemoteKvPool>();
  remote->layer_base.assign(2, reinterpret_cast<uint8_t*>(uintptr_t{4096}));
  remote->num_blocks = 3;
  b.remote_kv = remote;
  EXPECT_TRUE(ValidateForwardBatch(b, spec, 100, 64).ok());
  remote->num_blocks = 2;
  EXPECT_FALSE(ValidateForwardBatch(b, spec, 100, 64).ok());
  remote->num_blocks = 3;
  remote->layer_base.pop_back();
  EXPECT_FALSE(ValidateForwardBatch(b, spec, 100, 64).ok());
}

}  // namespace
}  // namespace tandem
