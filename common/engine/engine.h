#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/backend/backend.h"
#include "common/engine/engine_types.h"
#include "common/engine/kv/block_pool.h"
#include "common/engine/model/model.h"
#include "common/engine/spec/proposer.h"
#include "common/engine/spec_hooks.h"
#include "common/engine/step_sampling.h"

namespace tandem {

class DisaggFeature;
class EngineCore;
class SpecFeature;

// The inference engine both worker kinds share (DESIGN §4): continuous batching over a paged
// KV cache with prefix caching, chunked prefill, preemption and sampling; speculative decoding,
// structured output and disaggregation are features hooked into its step (README "Engine
// contract"). It knows nothing of RPC. Thread model: NOT thread-safe; one engine thread calls
// every method (servers put a queue in front of it), except where a method says otherwise.
class Engine {
 public:
  // `proposer` is required when options.spec.method is not kNone.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, std::shared_ptr<const Model> model,
      std::unique_ptr<Backend> backend, std::unique_ptr<Proposer> proposer = nullptr);
  ~Engine();

  // Validates and queues a request. INVALID_ARGUMENT names the bad field; RESOURCE_EXHAUSTED
  // when the queue is full or the request could never fit in the KV pool.
  absl::Status AddRequest(EngineRequest request);
  // Finishes every sequence of the request with kAbort and frees its blocks now. The abort
  // updates are returned by the next Step().
  void AbortRequest(const std::string& request_id);
  // Finishes one sample of a request (e.g. a stop string matched by the caller).
  void FinishSequence(const std::string& request_id, int32_t index, FinishReason reason);

  // Decode role: the KV of a remote-prefill request's prompt is in its reserved blocks.
  // first_tokens[i] (and logprobs[i] when requested) is sample i's first token, sampled by the
  // prefill worker. The request joins the running batch; its updates come with the next Step().
  absl::Status CompleteRemotePrefill(const std::string& request_id,
                                     const std::vector<int32_t>& first_tokens,
                                     const std::vector<TokenLogprobs>& logprobs);
  // Prefill role: the export of a finished prefill-only request is done; its blocks return to
  // the pool (full ones stay in the prefix cache).
  void ReleaseHold(const std::string& request_id);
  // Decode role: the transport released the blocks of a remote-prefill request that ended before
  // its KV arrived (SequenceUpdate::kv_fence): they return to the pool. Unknown fences: no-op.
  void ReleaseKvFence(uint64_t fence);

  // Runs one iteration (schedule, forward, sample) if there is work and returns what changed.
  std::vector<SequenceUpdate> Step();
  // There is something to compute or report now (or a feature signalled readiness).
  bool HasWork() const;
  // The earliest feature deadline (a reservation lease; InfiniteFuture when none): Step() must
  // run by then.
  absl::Time NextDeadline() const;
  EngineStats stats() const;
  // Called from any thread when a feature signals that something a sequence waits for is ready
  // (EngineWake): the loop owner (AsyncEngine) wakes its loop. Must not block or call the
  // engine. Null: none; clearing it waits for a call in progress.
  void set_wake_listener(std::function<void()> listener);

  // Hears every speculative verification (metrics); may be null, must outlive the engine.
  void set_spec_hooks(SpecHooks* hooks);
  const SpecOptions& spec_options() const;
  // The LoRA adapters this engine serves (EngineOptions::lora; null: LoRA is off). Thread-safe:
  // API threads load and unload through it while the engine runs.
  const std::shared_ptr<LoraRegistry>& lora_registry() const;

  const Model& model() const;
  Backend& backend();
  const Backend& backend() const;
  // What a remote prefill of `num_tokens` positions reserves and transfers of the local layers
  // (KvReservation::window_layers / window_first_block); empty layers without a window layout.
  // Reads only what is fixed at construction: callable from any thread.
  struct TransferWindow {
    std::vector<int64_t> layers;
    int64_t first_block = 0;
  };
  TransferWindow RemoteTransferWindow(int64_t num_tokens) const;
  int64_t max_model_len() const;
  const std::vector<int32_t>& eos_ids() const;
  BlockPool& block_pool();

 private:
  explicit Engine(std::unique_ptr<EngineCore> core);
  absl::Status Validate(const EngineRequest& request) const;
  void FailStep(const absl::Status& status, const SchedulerOutput& plan,
                std::vector<SequenceUpdate>* updates);
  // Fails `seqs` (those not finished) with `status`.
  void FailSequences(const absl::Status& status, const std::vector<Sequence*>& seqs,
                     std::vector<SequenceUpdate>* updates);

  // Overlapped steps (engine_overlap.cc, README "Overlapped steps"). A step left in flight: its
  // sampling (every sampled sequence on the device), its sequences (null once finished) with
  // their pending token.
  struct InflightStep {
    StepSampling sampling;
    std::vector<Sequence*> sampled;    // in plan order, as sampling's sequences
    std::vector<Sequence*> scheduled;  // every sequence of the step
  };
  // Whether this engine launches steps without waiting for them.
  bool AsyncSteps() const;
  // Whether a sequence sampled in a step may have its token still on the device while the next
  // step is planned and launched.
  static bool OverlapSafe(const Sequence& seq);
  // Whether the step now being planned may be planned before the step in flight is collected.
  bool CanPlanAhead() const;
  // Waits for the step in flight and appends its tokens (ending sequences they finish); null
  // afterwards.
  void CollectInflight(std::vector<SequenceUpdate>* updates);
  // Before a command ends sample `index` of `request_id` (every sample: -1) between steps: the
  // step in flight forgets those samples and their token in it is dropped, so they end on the
  // tokens their caller has seen, as in the synchronous loop (the device may still write that
  // token's KV into their blocks: stream order puts it before any later use of the blocks).
  void DropInflight(const std::string& request_id, int32_t index);

  std::unique_ptr<EngineCore> core_;
  DisaggFeature* disagg_ = nullptr;  // owned by core_
  SpecFeature* spec_ = nullptr;      // owned by core_
  std::vector<float> logits_;        // the rows sampled on the host
  StepSampling sampling_;
  std::unique_ptr<InflightStep> inflight_;  // the step left in flight, if any
};

}  // namespace tandem
