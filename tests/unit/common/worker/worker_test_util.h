#pragma once

// Shared by the worker roles' tests: engines on the bundled model, the greedy reference a plain
// engine run gives (what `tandem generate` prints), and a collector of a Decode stream.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/engine/async_engine.h"
#include "common/engine/engine_builder.h"
#include "common/worker/backend_regions.h"
#include "common/worker/kv_event_log.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.pb.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"

namespace tandem::testing {

inline std::unique_ptr<Engine> MakeEngine(int64_t blocks = 64) {
  return testing_util::MakeBundledEngine(blocks);
}

// An engine on its own thread, with what a KV transport needs of it.
struct RunningEngine {
  Backend* backend = nullptr;  // the engine's
  kvtransfer::KvLayout layout;
  std::unique_ptr<BackendRegions> regions;
  std::unique_ptr<AsyncEngine> engine;
};

// `events` (may be null; must outlive the engine) hears the prefix cache, as in a worker.
inline RunningEngine StartEngine(KvEventLog* events = nullptr, int64_t blocks = 64) {
  std::unique_ptr<Engine> e = MakeEngine(blocks);
  if (events != nullptr) {
    e->block_pool().set_listener({[events](BlockHash h) { events->Stored(h); },
                                  [events](BlockHash h) { events->Removed(h); }});
  }
  RunningEngine r;
  r.backend = &e->backend();
  r.layout = LayoutOf(*r.backend, e->model().model_id());
  r.regions = std::make_unique<BackendRegions>(r.backend);
  r.engine = std::make_unique<AsyncEngine>(std::move(e));
  return r;
}

// A 40-token prompt (three 16-token blocks, the last one partial).
inline std::vector<int32_t> Prompt() {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < 40; ++i) p.push_back(3 + (i * 37) % 400);
  return p;
}

inline v1::SamplingParams Greedy(int32_t max_tokens) {
  v1::SamplingParams s;
  s.set_temperature(0);
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  return s;
}

// The tokens a plain engine generates for `prompt` greedily, stepped on this thread.
inline std::vector<int32_t> ReferenceTokens(const std::vector<int32_t>& prompt,
                                            int32_t max_tokens) {
  std::unique_ptr<Engine> engine = MakeEngine();
  EngineRequest r;
  r.id = "reference";
  r.prompt = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  EXPECT_TRUE(engine->AddRequest(r).ok());
  std::vector<int32_t> out;
  while (engine->HasWork()) {
    for (const SequenceUpdate& u : engine->Step()) {
      out.insert(out.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  return out;
}

// Collects the responses of one Decode call (delivered on the engine's thread).
class DecodeStream {
 public:
  std::function<void(const v1::DecodeResponse&)> Callback() {
    return [this](const v1::DecodeResponse& r) {
      std::lock_guard<std::mutex> lock(mu_);
      responses_.push_back(r);
      cv_.notify_all();
    };
  }
  // Waits until a response satisfies `pred` (false after 60 s).
  bool WaitFor(const std::function<bool(const v1::DecodeResponse&)>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] {
      for (const auto& r : responses_) {
        if (pred(r)) return true;
      }
      return false;
    });
  }
  bool WaitForFinal() {
    return WaitFor([](const v1::DecodeResponse& r) { return r.has_final(); });
  }
  std::vector<int32_t> Tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int32_t> out;
    for (const auto& r : responses_) {
      if (r.has_tokens())
        out.insert(out.end(), r.tokens().token_ids().begin(), r.tokens().token_ids().end());
    }
    return out;
  }
  v1::SampleFinal Final() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : responses_) {
      if (r.has_final()) return r.final();
    }
    return {};
  }
  std::optional<v1::KvReservation> Reservation() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : responses_) {
      if (r.has_reservation()) return r.reservation();
    }
    return std::nullopt;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::DecodeResponse> responses_;
};

// Waits until `done` holds for the engine's stats (false after 30 s): frees are seen after the
// step that made them.
inline bool WaitForStats(const AsyncEngine& engine,
                         const std::function<bool(const EngineStats&)>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (done(engine.stats())) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

}  // namespace tandem::testing
