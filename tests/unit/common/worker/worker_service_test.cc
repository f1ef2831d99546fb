// WorkerService over gRPC (in-process channel) in front of a DecodeCore on a running engine, as
// the router sees a decode worker: GetInfo, a Decode stream with the tokens of a plain engine
// run, WatchStats (a snapshot, then the prefix-cache events the request caused), GetStats,
// Prefill on a worker without the role, and the drain.

#include "common/worker/worker_service.h"

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "decode_worker/decode_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/unit/common/worker/worker_test_util.h"

namespace tandem {
namespace {

using testing::Greedy;
using testing::Prompt;
using testing::ReferenceTokens;

class WorkerServiceTest : public ::testing::Test {
 protected:
  WorkerServiceTest() : running_(testing::StartEngine(&events_)), core_(running_.engine.get()) {
    WorkerServiceOptions o;
    o.info.set_role("decode");
    o.info.set_model_name("stories260k");
    o.watch_interval = absl::Milliseconds(10);
    service_ = std::make_unique<WorkerService>(o, running_.engine.get(), &events_, &core_, nullptr);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::Worker::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  ~WorkerServiceTest() override {
    service_->Stop();
    server_->Shutdown();
  }

  static v1::DecodeRequest Request(const std::string& id, int32_t max_tokens) {
    v1::DecodeRequest r;
    r.set_request_id(id);
    for (int32_t t : Prompt()) r.add_prompt_token_ids(t);
    *r.mutable_sampling() = Greedy(max_tokens);
    return r;
  }

  // One Decode call to its end: the tokens, the final and the call's status.
  grpc::Status Decode(const v1::DecodeRequest& request, std::vector<int32_t>* tokens,
                      v1::SampleFinal* final) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Decode(&context, request);
    v1::DecodeResponse r;
    while (reader->Read(&r)) {
      if (r.has_tokens()) {
        tokens->insert(tokens->end(), r.tokens().token_ids().begin(), r.tokens().token_ids().end());
      }
      if (r.has_final()) *final = r.final();
    }
    return reader->Finish();
  }

  KvEventLog events_;
  testing::RunningEngine running_;
  DecodeCore core_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(WorkerServiceTest, DecodeStreamsTheTokensOfAPlainEngineRun) {
  grpc::ClientContext info_context;
  v1::WorkerInfo info;
  ASSERT_TRUE(stub_->GetInfo(&info_context, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.role(), "decode");
  EXPECT_EQ(info.model_name(), "stories260k");
  EXPECT_FALSE(info.draining());

  std::vector<int32_t> tokens;
  v1::SampleFinal final;
  ASSERT_TRUE(Decode(Request("a", 24), &tokens, &final).ok());
  EXPECT_EQ(tokens, ReferenceTokens(Prompt(), 24));
  EXPECT_EQ(final.finish_reason(), v1::FINISH_REASON_LENGTH);
  // The call ends on the server (OnDone) just after the client read its status.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (service_->active_calls() != 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(service_->active_calls(), 0);

  grpc::ClientContext stats_context;
  v1::WorkerStats stats;
  ASSERT_TRUE(stub_->GetStats(&stats_context, v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.generated_tokens(), 24);
  EXPECT_EQ(stats.prompt_tokens(), static_cast<int64_t>(Prompt().size()));
  EXPECT_EQ(stats.kv_blocks_used(), 0);
}

TEST_F(WorkerServiceTest, WatchStatsStartsWithASnapshotThenStreamsCacheEvents) {
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto watch = stub_->WatchStats(&watch_context, v1::StatsRequest());
  v1::WorkerStats first;
  ASSERT_TRUE(watch->Read(&first));
  EXPECT_TRUE(first.snapshot());
  EXPECT_EQ(first.stored_block_hashes_size(), 0);  // nothing cached yet

  std::vector<int32_t> tokens;
  v1::SampleFinal final;
  ASSERT_TRUE(Decode(Request("cache", 24), &tokens, &final).ok());
  // 40 prompt + 24 generated tokens: the first three 16-token blocks are full and cached.
  std::vector<uint64_t> stored;
  v1::WorkerStats next;
  while (stored.size() < 3 && watch->Read(&next)) {
    EXPECT_FALSE(next.snapshot());
    stored.insert(stored.end(), next.stored_block_hashes().begin(),
                  next.stored_block_hashes().end());
  }
  EXPECT_EQ(stored.size(), 3u);
  const KvEventLog::Delta truth = events_.Read(0);
  EXPECT_EQ(truth.stored.size(), 3u);
  watch_context.TryCancel();
  watch->Finish();
}

// The events of the KV cache tiers (what the tiers' listener appends) travel with their medium.
TEST_F(WorkerServiceTest, WatchStatsCarriesTierEventsWithTheirMedium) {
  events_.Stored(11, KvMedium::kDisk);
  events_.Stored(12, KvMedium::kHost);
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto watch = stub_->WatchStats(&watch_context, v1::StatsRequest());
  auto tier = [](const v1::WorkerStats& m, v1::KvMedium medium) -> const v1::KvTierEvents* {
    for (const v1::KvTierEvents& e : m.tier_events()) {
      if (e.medium() == medium) return &e;
    }
    return nullptr;
  };
  v1::WorkerStats first;
  ASSERT_TRUE(watch->Read(&first));
  ASSERT_TRUE(first.snapshot());
  EXPECT_EQ(first.stored_block_hashes_size(), 0) << "tier blocks are not pool blocks";
  ASSERT_NE(tier(first, v1::KV_MEDIUM_DISK), nullptr);
  EXPECT_THAT(tier(first, v1::KV_MEDIUM_DISK)->stored_block_hashes(), ::testing::ElementsAre(11));
  ASSERT_NE(tier(first, v1::KV_MEDIUM_HOST), nullptr);
  EXPECT_THAT(tier(first, v1::KV_MEDIUM_HOST)->stored_block_hashes(), ::testing::ElementsAre(12));
  events_.Removed(11, KvMedium::kDisk);
  events_.Stored(13, KvMedium::kDisk);
  v1::WorkerStats next;
  const v1::KvTierEvents* disk = nullptr;
  while (disk == nullptr && watch->Read(&next)) disk = tier(next, v1::KV_MEDIUM_DISK);
  ASSERT_NE(disk, nullptr);
  EXPECT_THAT(disk->removed_block_hashes(), ::testing::ElementsAre(11));
  EXPECT_THAT(disk->stored_block_hashes(), ::testing::ElementsAre(13));
  watch_context.TryCancel();
  watch->Finish();
}

TEST(ToWorkerStatsTest, ReportsEachTierOnWithItsMeasuredCosts) {
  EngineStats s;
  EXPECT_EQ(ToWorkerStats(s).tier_events_size(), 0);
  s.kv_tiers.enabled = true;
  s.kv_tiers.tier[1].enabled = true;  // disk only
  s.kv_tiers.tier[1].load_seconds_per_block = 0.002;
  s.kv_tiers.prefill_seconds_per_block = 0.05;
  const v1::WorkerStats w = ToWorkerStats(s);
  ASSERT_EQ(w.tier_events_size(), 1);
  EXPECT_EQ(w.tier_events(0).medium(), v1::KV_MEDIUM_DISK);
  EXPECT_DOUBLE_EQ(w.tier_events(0).load_seconds_per_block(), 0.002);
  EXPECT_DOUBLE_EQ(w.prefill_seconds_per_block(), 0.05);
}

TEST_F(WorkerServiceTest, PrefillWithoutThePrefillRoleIsUnimplemented) {
  grpc::ClientContext context;
  v1::PrefillResponse response;
  v1::PrefillRequest request;
  request.set_request_id("p");
  const grpc::Status st = stub_->Prefill(&context, request, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
}

TEST_F(WorkerServiceTest, ADrainingWorkerRefusesNewCallsAndSaysSo) {
  service_->StartDrain();
  std::vector<int32_t> tokens;
  v1::SampleFinal final;
  const grpc::Status st = Decode(Request("late", 8), &tokens, &final);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_TRUE(tokens.empty());
  grpc::ClientContext info_context;
  v1::WorkerInfo info;
  ASSERT_TRUE(stub_->GetInfo(&info_context, v1::InfoRequest(), &info).ok());
  EXPECT_TRUE(info.draining());
  EXPECT_EQ(running_.engine->stats().prompt_tokens, 0);
}

}  // namespace
}  // namespace tandem
