// Disaggregation at the engine level: a prefill-role engine computes prompts and exports KV
// layer by layer into blocks a decode-role engine reserved (copied here by hand, as a transport
// would), and the decode engine continues. Outputs equal a monolithic engine's, with greedy and
// seeded sampling, n > 1, the decode side's own prefix cache, and migration with prior output.

#include <algorithm>
#include <cstring>
#include <map>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"

namespace tandem {
namespace {

std::unique_ptr<Engine> MakeEngine(int64_t blocks = 128) {
  return testing_util::MakeBundledEngine(blocks);
}

EngineRequest MakeRequest(const std::string& id, std::vector<int32_t> prompt, float temperature,
                          int32_t n = 1) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = 24;
  r.params.ignore_eos = true;
  r.params.temperature = temperature;
  r.params.seed = 77;
  r.n = n;
  return r;
}

using Outputs = std::map<int32_t, std::vector<int32_t>>;

Outputs Drain(Engine& e, Outputs out = {}) {
  while (e.HasWork()) {
    for (const auto& u : e.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      out[u.index].insert(out[u.index].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  return out;
}

// Runs `r` disaggregated: P computes the prompt and exports the KV of the blocks D lacks, layer
// by layer, into D's reserved blocks; D continues from the first tokens P sampled.
Outputs RunDisaggregated(Engine& p, Engine& d, EngineRequest r, int* layers_seen = nullptr) {
  EngineRequest dr = r;
  dr.remote_prefill = true;
  EXPECT_TRUE(d.AddRequest(dr).ok());
  std::optional<KvReservation> reservation;
  while (!reservation.has_value()) {
    for (const auto& u : d.Step()) {
      if (u.reservation.has_value()) reservation = u.reservation;
    }
  }
  const int64_t block_size = p.backend().kv_spec().block_size;
  const size_t first_block = reservation->cached_tokens / block_size;
  const size_t region = p.backend().kv_spec().bytes_per_block_layer();
  auto hooks = std::make_shared<KvExportHooks>();
  int layers = 0;
  hooks->on_layer = [&](const std::vector<int32_t>& blocks, int64_t layer) {
    ++layers;
    EXPECT_EQ(blocks.size(), reservation->blocks.size());
    for (size_t i = first_block; i < blocks.size(); ++i) {
      std::memcpy(d.backend().HostBlockRegion(layer, reservation->blocks[i]),
                  p.backend().HostBlockRegion(layer, blocks[i]), region);
    }
  };
  EngineRequest pr = r;
  pr.prefill_only = true;
  pr.export_hooks = hooks;
  EXPECT_TRUE(p.AddRequest(pr).ok());
  std::map<int32_t, int32_t> first;
  bool held = false;
  while (p.HasWork()) {
    for (const auto& u : p.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      if (!u.new_tokens.empty()) first[u.index] = u.new_tokens[0];
      if (!u.held_blocks.empty()) held = true;
    }
  }
  EXPECT_TRUE(held);
  EXPECT_GT(p.stats().kv_blocks_held, 0);
  p.ReleaseHold(r.id);
  EXPECT_EQ(p.stats().kv_blocks_held, 0);
  EXPECT_EQ(p.stats().kv_blocks_used, 0);
  std::vector<int32_t> first_tokens;
  for (auto& [i, t] : first) first_tokens.push_back(t);
  EXPECT_TRUE(d.CompleteRemotePrefill(r.id, first_tokens, {}).ok());
  if (layers_seen) *layers_seen = layers;
  return Drain(d);
}

std::vector<int32_t> Prompt(int len, int salt) {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < len; ++i) p.push_back(3 + (i * 37 + salt * 11) % 500);
  return p;
}

TEST(EngineDisaggTest, GreedyAndSampledOutputsEqualMonolithic) {
  auto mono = MakeEngine(), p = MakeEngine(), d = MakeEngine();
  for (float temperature : {0.0f, 1.0f}) {
    for (int len : {5, 16, 33, 70}) {
      EngineRequest r = MakeRequest("r" + std::to_string(len), Prompt(len, len), temperature);
      ASSERT_TRUE(mono->AddRequest(r).ok());
      Outputs want = Drain(*mono);
      int layers = 0;
      Outputs got = RunDisaggregated(*p, *d, r, &layers);
      EXPECT_EQ(got, want) << "prompt " << len << " temperature " << temperature;
      EXPECT_EQ(layers, 5) << "one export call per layer of the final chunk";
      EXPECT_EQ(d->stats().kv_blocks_used, 0);
    }
  }
}

TEST(EngineDisaggTest, SamplesAndDecodeSidePrefixCache) {
  auto mono = MakeEngine(), p = MakeEngine(), d = MakeEngine();
  EngineRequest r = MakeRequest("n4", Prompt(40, 1), 1.0f, /*n=*/4);
  ASSERT_TRUE(mono->AddRequest(r).ok());
  Outputs want = Drain(*mono);
  EXPECT_EQ(RunDisaggregated(*p, *d, r), want);
  // Same prefix again: D already holds 32 of the 40 tokens, P sends only the rest.
  EngineRequest again = MakeRequest("again", Prompt(40, 1), 0.0f);
  ASSERT_TRUE(mono->AddRequest(again).ok());
  want = Drain(*mono);
  EngineRequest dr = again;
  dr.id = "probe";
  dr.remote_prefill = true;
  ASSERT_TRUE(d->AddRequest(dr).ok());
  auto updates = d->Step();
  ASSERT_EQ(updates.size(), 1u);
  ASSERT_TRUE(updates[0].reservation.has_value());
  EXPECT_EQ(updates[0].reservation->cached_tokens, 32);
  d->AbortRequest("probe");
  Drain(*d);
  EXPECT_EQ(RunDisaggregated(*p, *d, again), want);
}

TEST(EngineDisaggTest, MigrationWithPriorOutputContinuesTheSameStream) {
  for (float temperature : {0.0f, 0.8f}) {
    auto mono = MakeEngine(), resumed = MakeEngine();
    EngineRequest r = MakeRequest("m", Prompt(20, 2), temperature);
    ASSERT_TRUE(mono->AddRequest(r).ok());
    std::vector<int32_t> full = Drain(*mono)[0];
    ASSERT_EQ(full.size(), 24u);
    EngineRequest rest = r;
    rest.prior_output.assign(full.begin(), full.begin() + 9);
    ASSERT_TRUE(resumed->AddRequest(rest).ok());
    std::vector<int32_t> tail = Drain(*resumed)[0];
    EXPECT_EQ(tail, std::vector<int32_t>(full.begin() + 9, full.end())) << temperature;
  }
}

TEST(EngineDisaggTest, ReservationLeaseExpiresAndFreesBlocks) {
  auto d = MakeEngine();
  EngineRequest r = MakeRequest("lease", Prompt(30, 3), 0.0f);
  r.remote_prefill = true;
  r.kv_lease = absl::Milliseconds(20);
  ASSERT_TRUE(d->AddRequest(r).ok());
  d->Step();
  EXPECT_GT(d->stats().kv_blocks_used, 0);
  EXPECT_EQ(d->stats().num_awaiting_kv, 1);
  EXPECT_FALSE(d->HasWork()) << "an awaiting reservation needs no step";
  EXPECT_LT(d->NextDeadline(), absl::InfiniteFuture());
  absl::SleepFor(absl::Milliseconds(30));
  auto updates = d->Step();
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].finish_reason, FinishReason::kError);
  EXPECT_EQ(updates[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(d->stats().kv_blocks_used, 0);
  EXPECT_EQ(d->stats().num_awaiting_kv, 0);
}

// A fenced reservation that ends before its KV arrived (aborted, or its lease expired) keeps its
// blocks out of the free list until ReleaseKvFence (a transport may still write them); a
// reservation without a fence, or one whose KV arrived, frees them at once.
TEST(EngineDisaggTest, AFencedReservationHoldsItsBlocksUntilReleased) {
  auto d = MakeEngine(16);
  ASSERT_EQ(d->stats().kv_blocks_used, 0);
  for (bool expire : {false, true}) {
    EngineRequest r = MakeRequest(expire ? "expire" : "abort", Prompt(40, 5), 0.0f);
    r.remote_prefill = true;
    r.kv_fence = true;
    if (expire) r.kv_lease = absl::Milliseconds(20);
    ASSERT_TRUE(d->AddRequest(r).ok());
    std::vector<int32_t> reserved;
    for (const auto& u : d->Step()) {
      if (u.reservation.has_value()) reserved = u.reservation->blocks;
    }
    ASSERT_EQ(reserved.size(), 3u);
    std::vector<SequenceUpdate> ended;
    if (expire) {
      absl::SleepFor(absl::Milliseconds(30));
    } else {
      d->AbortRequest(r.id);
    }
    ended = d->Step();
    ASSERT_EQ(ended.size(), 1u);
    ASSERT_TRUE(ended[0].finished);
    const uint64_t fence = ended[0].kv_fence;
    ASSERT_NE(fence, 0u);
    EXPECT_EQ(d->stats().kv_blocks_held, 3);
    EXPECT_EQ(d->stats().kv_blocks_used, 3);
    // The pool hands out the last freed blocks first: a new reservation would get these.
    EngineRequest other = MakeRequest("other", Prompt(40, 6), 0.0f);
    other.remote_prefill = true;
    ASSERT_TRUE(d->AddRequest(other).ok());
    for (const auto& u : d->Step()) {
      if (!u.reservation.has_value()) continue;
      for (int32_t b : u.reservation->blocks) {
        EXPECT_EQ(std::count(reserved.begin(), reserved.end(), b), 0) << "fenced block reused";
      }
    }
    d->AbortRequest("other");  // no fence: freed at once
    for (const auto& u : d->Step()) EXPECT_EQ(u.kv_fence, 0u);
    EXPECT_EQ(d->stats().kv_blocks_used, 3);
    d->ReleaseKvFence(fence);
    d->ReleaseKvFence(fence);  // once only
    EXPECT_EQ(d->stats().kv_blocks_held, 0);
    EXPECT_EQ(d->stats().kv_blocks_used, 0);
  }
  // KV that arrived leaves no fence.
  auto p = MakeEngine();
  EngineRequest done = MakeRequest("done", Prompt(30, 7), 0.0f);
  done.kv_fence = true;
  RunDisaggregated(*p, *d, done);
  EXPECT_EQ(d->stats().kv_blocks_held, 0);
}

}  // namespace
}  // namespace tandem
