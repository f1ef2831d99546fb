// The engine's "waiting for an external resource" state, driven by a test feature registered
// through EngineOptions::extensions the way a grammar-compile or KV-tier feature would be: a
// request held from admission (kPending) holds nothing while the others run; one held while
// running (kAwaiting) keeps its blocks; both continue, bit-identical to a run alone, once the
// feature signals readiness from another thread, which also wakes a sleeping AsyncEngine loop.

#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/engine/async_engine.h"
#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

// Holds requests whose id starts with "wait" from admission, and those starting with "pause" once
// they have produced `pause_after` tokens (once: a flag in the sequence's feature slot). Ready(id),
// from any thread, releases the request at the next step.
class WaitFeature final : public EngineFeature {
 public:
  explicit WaitFeature(int64_t pause_after) : pause_after_(pause_after) {}
  const char* name() const override { return "test wait"; }

  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override {
    if (slot_ < 0) slot_ = core().AllocateFeatureSlot();
    if (absl::StartsWith(request.id, "wait")) Hold(seq);
    return absl::OkStatus();
  }
  void OnToken(Sequence* seq, int32_t, bool, TokenVerdict*) override {
    if (!absl::StartsWith(seq->request_id, "pause") || seq->num_output() != pause_after_ ||
        seq->features.get<Paused>(slot_) != nullptr) {
      return;
    }
    seq->features.set(slot_, std::make_unique<Paused>());
    Hold(seq);
  }
  void OnStepBegin(std::vector<SequenceUpdate>*) override {
    std::vector<std::string> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready.swap(ready_);
    }
    for (const std::string& id : ready) {
      auto it = held_.find(id);
      if (it == held_.end()) continue;  // ended while it waited
      Sequence* seq = it->second;
      held_.erase(it);
      core().scheduler().Release(seq);
    }
  }
  void OnFinish(Sequence* seq, FinishReason, SequenceUpdate*) override {
    held_.erase(seq->request_id);
  }

  // Any thread: the resource `id` waits for is ready.
  void Ready(const std::string& id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(id);
    }
    core().wake().Notify();
  }
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }  // engine thread

 private:
  struct Paused : FeatureState {
    std::unique_ptr<FeatureState> Clone() const override { return std::make_unique<Paused>(); }
  };
  void Hold(Sequence* seq) {
    core().scheduler().Hold(seq);
    held_[seq->request_id] = seq;
  }

  const int64_t pause_after_;
  int slot_ = -1;
  std::map<std::string, Sequence*> held_;
  std::mutex mu_;
  std::vector<std::string> ready_;  // under mu_
};

// An engine on the bundled model; with `feature` set, a WaitFeature is registered and returned.
std::unique_ptr<Engine> MakeEngine(WaitFeature** feature = nullptr) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = 64;
  b.show_progress = false;
  b.threads = 1;
  b.engine.scheduler.max_num_batched_tokens = 64;
  if (feature != nullptr) {
    b.engine.extensions = [feature](KvCacheManager*, EngineExtensions* out) {
      auto f = std::make_unique<WaitFeature>(/*pause_after=*/5);
      *feature = f.get();
      out->features.push_back(std::move(f));
    };
  }
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? std::move(built->engine) : nullptr;
}

EngineRequest Request(const std::string& id, int32_t first, int32_t max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = {1};
  for (int32_t i = 0; i < 20; ++i) r.prompt.push_back(3 + (first + 37 * i) % 500);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

using Outputs = std::map<std::string, std::vector<int32_t>>;

// Steps while there is work; collects tokens and the ids that finished.
void Drain(Engine& engine, Outputs* tokens, std::vector<std::string>* finished) {
  for (int steps = 0; engine.HasWork() && steps < 1000; ++steps) {
    for (const SequenceUpdate& u : engine.Step()) {
      auto& t = (*tokens)[u.request_id];
      t.insert(t.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.status;
        finished->push_back(u.request_id);
      }
    }
  }
}

// Each request alone on an engine without the feature.
Outputs Solo(const std::vector<EngineRequest>& requests) {
  Outputs out;
  auto engine = MakeEngine();
  std::vector<std::string> finished;
  for (const EngineRequest& r : requests) {
    EXPECT_TRUE(engine->AddRequest(r).ok());
    Drain(*engine, &out, &finished);
  }
  return out;
}

TEST(EngineWaitTest, APendingRequestHoldsNothingWhileOthersRunThenRunsIdentically) {
  const std::vector<EngineRequest> requests = {Request("wait-a", 10, 12), Request("b", 20, 9),
                                               Request("c", 30, 14)};
  WaitFeature* feature = nullptr;
  auto engine = MakeEngine(&feature);
  ASSERT_NE(feature, nullptr);
  for (const EngineRequest& r : requests) ASSERT_TRUE(engine->AddRequest(r).ok());
  Outputs got;
  std::vector<std::string> finished;
  Drain(*engine, &got, &finished);
  EXPECT_EQ(finished, (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(got["wait-a"].empty());
  EXPECT_FALSE(engine->HasWork()) << "a held request alone gives a synchronous driver no work";
  EngineStats s = engine->stats();
  EXPECT_EQ(s.num_waiting, 1);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.kv_blocks_used, 0) << "a pending sequence holds no blocks";

  std::thread([feature] { feature->Ready("wait-a"); }).join();
  EXPECT_TRUE(engine->HasWork());
  Drain(*engine, &got, &finished);
  EXPECT_EQ(finished.back(), "wait-a");
  EXPECT_EQ(got, Solo(requests));
  EXPECT_EQ(feature->num_held(), 0);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

TEST(EngineWaitTest, AnAwaitingRequestKeepsItsBlocksWhileOthersRunThenContinuesIdentically) {
  const std::vector<EngineRequest> requests = {Request("pause-a", 40, 16), Request("b", 50, 12)};
  WaitFeature* feature = nullptr;
  auto engine = MakeEngine(&feature);
  for (const EngineRequest& r : requests) ASSERT_TRUE(engine->AddRequest(r).ok());
  Outputs got;
  std::vector<std::string> finished;
  Drain(*engine, &got, &finished);
  EXPECT_EQ(finished, (std::vector<std::string>{"b"}));
  EXPECT_EQ(got["pause-a"].size(), 5u);
  EngineStats s = engine->stats();
  EXPECT_EQ(s.num_awaiting_kv, 1);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.kv_blocks_used, 2) << "its 21 + 4 computed tokens stay in two blocks of 16";

  feature->Ready("pause-a");
  Drain(*engine, &got, &finished);
  EXPECT_EQ(finished.back(), "pause-a");
  EXPECT_EQ(got, Solo(requests));
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->stats().num_awaiting_kv, 0);
}

TEST(EngineWaitTest, AbortingAHeldRequestEndsItAndFreesItsBlocks) {
  WaitFeature* feature = nullptr;
  auto engine = MakeEngine(&feature);
  ASSERT_TRUE(engine->AddRequest(Request("wait-x", 60, 8)).ok());
  ASSERT_TRUE(engine->AddRequest(Request("pause-y", 70, 30)).ok());
  Outputs got;
  std::vector<std::string> finished;
  Drain(*engine, &got, &finished);
  EXPECT_EQ(feature->num_held(), 2);
  EXPECT_GT(engine->stats().kv_blocks_used, 0);
  engine->AbortRequest("wait-x");
  engine->AbortRequest("pause-y");
  EXPECT_EQ(feature->num_held(), 0) << "OnFinish: the feature forgets what it held";
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  int aborted = 0;
  for (const SequenceUpdate& u : engine->Step()) {
    aborted += u.finished && u.finish_reason == FinishReason::kAbort;
  }
  EXPECT_EQ(aborted, 2);
  feature->Ready("wait-x");  // too late: ignored
  engine->Step();
  EXPECT_FALSE(engine->HasWork());
  EXPECT_EQ(engine->stats().num_waiting, 0);
}

TEST(EngineWaitTest, ReadinessWakesTheAsyncEngineLoop) {
  WaitFeature* feature = nullptr;
  AsyncEngine async(MakeEngine(&feature));
  std::mutex mu;
  Outputs got;
  std::map<std::string, std::promise<void>> done;
  std::map<std::string, std::future<void>> finished;
  for (const char* id : {"wait-a", "b"}) finished[id] = done[id].get_future();
  auto submit = [&](const EngineRequest& r) {
    async.Submit(r, [&, id = r.id](const SequenceUpdate& u) {
      std::lock_guard<std::mutex> lock(mu);
      got[id].insert(got[id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) done.at(id).set_value();
    });
  };
  const std::vector<EngineRequest> requests = {Request("wait-a", 80, 10), Request("b", 90, 10)};
  for (const EngineRequest& r : requests) submit(r);
  finished["b"].wait();
  // The loop now sleeps: only a held request is left and no deadline is set.
  int64_t waiting = -1;
  async.RunOnEngineThread([&](Engine& e) { waiting = e.stats().num_waiting; });
  EXPECT_EQ(waiting, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread([feature] { feature->Ready("wait-a"); }).join();
  ASSERT_EQ(finished["wait-a"].wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the loop did not wake when the feature signalled readiness";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(got, Solo(requests));
}

}  // namespace
}  // namespace tandem
