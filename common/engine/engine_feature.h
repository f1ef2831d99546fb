#pragma once

// The engine's feature seam (README "Engine contract"): a feature (speculative decoding,
// structured output, disaggregation, ...) is a class with hooks the engine calls at named
// points of a step, in the order features were registered, all on the engine thread. Its code
// and tests stand in its own files; the engine's core only registers it (Engine::Create, or
// EngineOptions::extensions for features a binary adds).

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/engine/backend/backend.h"
#include "common/engine/engine_types.h"
#include "common/engine/finish_check.h"
#include "common/engine/scheduler/batching_policy.h"
#include "common/engine/scheduler/scheduler.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

class EngineCore;

class EngineFeature {
 public:
  virtual ~EngineFeature() = default;
  virtual const char* name() const = 0;

  // Called once by Engine::Create, before any hook: the engine state this feature works on.
  void Attach(EngineCore* core) { core_ = core; }

  // --- Admission (Engine::AddRequest) ---
  // Refuses a request (INVALID_ARGUMENT naming the field); nothing was created yet.
  virtual absl::Status Validate(const EngineRequest& request) const { return absl::OkStatus(); }
  // Sets this feature's state in a new sequence (sample 0, queued as waiting). May Hold it. An
  // error rejects the request: the features admitted before see OnFinish(kError) and the
  // sequence is dropped.
  virtual absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) {
    return absl::OkStatus();
  }
  // A token produced elsewhere (a prefill worker's first token) is about to be appended to
  // `seq`: refuse it (INVALID_ARGUMENT) if it breaks this feature's rules. Must not change state.
  virtual absl::Status CheckForeignToken(const Sequence& seq, int32_t token) const {
    return absl::OkStatus();
  }
  // Whether checking and appending a token produced elsewhere to `seq` (CheckForeignToken, then
  // OnToken) would now wait for work running off the engine thread (a grammar whose state graph
  // a mask computation holds). While it is true the caller keeps the sequence held and asks
  // again at a later step's start; the feature's work, once done, wakes the engine.
  virtual bool ForeignTokenPending(const Sequence& seq) const { return false; }

  // --- A step (Engine::Step), in this order ---
  // 1. Every step, first, even with nothing to compute: expire what timed out, make ready what
  //    an external resource released (Scheduler::Release). May end sequences into `updates`.
  virtual void OnStepBegin(std::vector<SequenceUpdate>* updates) {}
  // 2. There is something to compute, before the scheduler plans: e.g. propose drafts.
  virtual void BeforeSchedule() {}
  // 3. After the plan: report what it decided (e.g. remote-prefill reservations).
  virtual void AfterSchedule(const SchedulerOutput& plan, std::vector<SequenceUpdate>* updates) {}
  // 4. The batch is built from the plan; `sampled` are the sequences that get logits. A feature
  //    may start work that overlaps the forward pass, set or chain batch->on_layer_done, or
  //    append rows (their logits follow the plan's and are never sampled).
  virtual void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                             ForwardBatch* batch) {}
  // 5. The forward pass returned (successfully or not): join what BeforeForward started.
  virtual void AfterForward() {}
  // 6. Sampling, per sequence in `sampled` order. Sample: take over the sequence's logit rows
  //    (1 + its draft length, from `logits`) and append its tokens; true when it did (the first
  //    feature that does wins; none: the engine samples one token).
  virtual bool Sample(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates) {
    return false;
  }
  // A logits row of `seq`, after the sampler's processing (bias, min_tokens, penalties) and
  // before temperature / top-k / top-p / min-p: e.g. mask what a grammar forbids.
  virtual void OnLogits(Sequence* seq, float* logits) {}
  // Before the forward pass, for each sequence of `sampled` the backend may sample on the device
  // (README "Sampling on the device"): false keeps its row for the host (step 9 as above: Sample,
  // OnLogits); true lets the device sample it, with what OnLogits would do to the row expressed
  // in `row->mask` (a feature that overrides Sample or OnLogits must override this too).
  virtual bool OnDeviceSample(Sequence* seq, DeviceSampleRow* row) { return true; }
  // A token was appended to `seq` (`eos`: one of the model's end-of-sequence ids): update this
  // feature's state and say what it means for the sequence's end (finish_check.h). The engine
  // stops asking features once one reports an error.
  virtual void OnToken(Sequence* seq, int32_t token, bool eos, TokenVerdict* verdict) {}
  // 7. `seq` ends (any reason; also aborts between steps), before the scheduler frees its
  //    blocks: release this feature's resources, fill its part of the finishing update. The
  //    sequence stays readable until the end of the step; forget every pointer to it here.
  virtual void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) {}

  // --- Queries (engine thread) ---
  // When Step() must run next at the latest (InfiniteFuture: no deadline).
  virtual absl::Time NextDeadline() const { return absl::InfiniteFuture(); }
  // Adds this feature's numbers to a statistics snapshot.
  virtual void AddStats(EngineStats* stats) const {}

 protected:
  EngineCore& core() const { return *core_; }

 private:
  EngineCore* core_ = nullptr;
};

// What EngineOptions::extensions adds to an engine: a batching policy for its scheduler (null:
// ContinuousBatching) and features whose hooks run after the built-in ones, in this order.
struct EngineExtensions {
  std::unique_ptr<BatchingPolicy> batching;
  std::vector<std::unique_ptr<EngineFeature>> features;
};

// Wakes the engine loop from any thread. A feature whose sequence waits for an external
// resource (Scheduler::Hold) learns on its own thread that the resource is ready, records that
// under its own lock and calls Notify; at the next step its OnStepBegin releases the sequence
// on the engine thread. Thread-safe.
class EngineWake {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    notified_.store(true);
    if (listener_) listener_();
  }
  // Whether Notify was called since the last Take (engine thread, at the start of a step).
  bool Take() { return notified_.exchange(false); }
  bool notified() const { return notified_.load(); }
  // Called by Notify on the notifying thread (AsyncEngine: wake the loop); must not block or
  // call into the engine. Null: none. Clearing it waits for a Notify in progress.
  void set_listener(std::function<void()> listener) {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = std::move(listener);
  }

 private:
  std::mutex mu_;
  std::atomic<bool> notified_{false};
  std::function<void()> listener_;
};

}  // namespace tandem
