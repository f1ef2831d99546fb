#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"

namespace tandem {

// The engine's side of disaggregation (DESIGN §2) as a feature. Decode role: a remote-prefill
// request is admitted holding its prompt's blocks (Scheduler::ReserveRemote, kAwaiting) under a
// lease; its reservation is reported after the plan, it expires at the start of a step, and
// CompleteRemotePrefill makes it runnable. Prefill role: the last prompt chunk's layers are
// exported as they complete, and a finished prefill-only request holds its blocks until
// ReleaseHold. A prompt whose KV arrived while a feature cannot take its first tokens yet
// (EngineFeature::ForeignTokenPending: its grammar busy off the loop) stays held, its lease
// stopped, and is completed at the start of the first step at which it can. A decode-role
// request with a fence (EngineRequest::kv_fence) that ends before its KV arrived leaves its
// blocks held under a fence id until ReleaseKvFence: the transport may still write them.
class DisaggFeature final : public EngineFeature {
 public:
  const char* name() const override { return "disaggregation"; }

  absl::Status Validate(const EngineRequest& request) const override;
  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  void OnStepBegin(std::vector<SequenceUpdate>* updates) override;  // lease expiry
  void AfterSchedule(const SchedulerOutput& plan, std::vector<SequenceUpdate>* updates) override;
  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;  // layer-wise export
  void OnToken(Sequence* seq, int32_t token, bool eos, TokenVerdict* verdict) override;
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;
  absl::Time NextDeadline() const override;  // the earliest lease
  void AddStats(EngineStats* stats) const override;

  // Engine::CompleteRemotePrefill, Engine::ReleaseHold, Engine::RemoteTransferWindow.
  absl::Status CompleteRemotePrefill(const std::string& request_id,
                                     const std::vector<int32_t>& first_tokens,
                                     const std::vector<TokenLogprobs>& logprobs);
  void ReleaseHold(const std::string& request_id);
  void ReleaseKvFence(uint64_t fence);
  // Reads only what is fixed at construction: callable from any thread.
  void TransferWindow(int64_t num_tokens, std::vector<int64_t>* layers, int64_t* first_block) const;

 private:
  // First tokens whose KV arrived but that a feature could not take yet.
  struct Arrived {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
  };

  // Checks the first tokens and makes `seq` runnable with them (its updates into `updates`).
  absl::Status Complete(Sequence* seq, const std::vector<int32_t>& first_tokens,
                        const std::vector<TokenLogprobs>& logprobs,
                        std::vector<SequenceUpdate>* updates);

  std::unordered_map<std::string, SequenceBlocks> holds_;  // prefill role: blocks held
  std::unordered_map<std::string, Arrived> arrived_;       // decode role: by request id
  std::unordered_map<uint64_t, SequenceBlocks> fences_;    // decode role: by fence id
  uint64_t next_fence_ = 0;
  int64_t held_blocks_ = 0;
};

}  // namespace tandem
