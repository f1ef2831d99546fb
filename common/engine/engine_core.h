#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/engine/backend/backend.h"
#include "common/engine/engine_faults.h"
#include "common/engine/engine_feature.h"
#include "common/engine/engine_types.h"
#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/model/model.h"
#include "common/engine/sampler/device_sample.h"
#include "common/engine/sampler/rng.h"
#include "common/engine/scheduler/scheduler.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

// What every part of a step shares (README "Engine contract"): the model, backend, KV pool,
// scheduler and the request table, the registered features, and the operations on one sequence
// that the step and the features use (append a token, fork samples, finish). Owned by the
// Engine; features reach it through EngineFeature::core(). Engine thread only, except wake().
class EngineCore {
 public:
  // `options` are validated by Engine::Create.
  EngineCore(const EngineOptions& options, std::shared_ptr<const Model> model,
             std::unique_ptr<Backend> backend);
  ~EngineCore();

  // --- Parts ---
  const EngineOptions& options() const { return options_; }
  const Model& model() const { return *model_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  BlockPool& pool() { return *pool_; }
  const BlockPool& pool() const { return *pool_; }
  KvCacheManager& kv() { return *kv_; }
  const KvCacheManager& kv() const { return *kv_; }
  Scheduler& scheduler() { return *scheduler_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  EngineFaultInjector* faults() { return faults_.get(); }  // null unless fault injection is on
  EngineStats& stats() { return stats_; }                  // the cumulative counters
  const EngineStats& stats() const { return stats_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_model_len() const { return max_model_len_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool IsEos(int32_t token) const;
  EngineWake& wake() { return wake_; }  // any thread

  // --- Features, called in registration order ---
  void AddFeature(std::unique_ptr<EngineFeature> feature);
  // Registers the features EngineOptions::extensions made (after the built-in ones).
  void AddExtensionFeatures();
  const std::vector<std::unique_ptr<EngineFeature>>& features() const { return features_; }
  // A slot of Sequence::features for a feature registered at run time.
  int AllocateFeatureSlot() { return next_feature_slot_++; }

  // --- Requests: request id -> its sequences (sample 0 first) ---
  using Samples = std::vector<std::unique_ptr<Sequence>>;
  Samples* FindRequest(const std::string& request_id);
  const std::unordered_map<std::string, Samples>& requests() const { return requests_; }
  // A new sample 0 (identity and seed set); the caller fills the rest and calls Admit.
  std::unique_ptr<Sequence> NewSequence(const std::string& request_id,
                                        const std::optional<uint64_t>& seed);
  // Queues `seq` as waiting and runs the features' OnAdmit; on an error nothing is kept.
  absl::Status Admit(std::unique_ptr<Sequence> seq, const EngineRequest& request);
  // Updates to report with the next Step() (aborts and completions between steps).
  std::vector<SequenceUpdate>& pending_updates() { return pending_updates_; }

  // --- Operations on one sequence ---
  // The update of `seq` in `updates` this step (created on first use).
  static SequenceUpdate& UpdateFor(Sequence* seq, std::vector<SequenceUpdate>* updates);
  // The sampler's processing of one logits row (bias, min_tokens, penalties), then every
  // feature's OnLogits.
  void ProcessLogits(Sequence* seq, float* logits);
  // `row` itself, or a copy of it when `seq` reports logprobs (computed from raw logits, which
  // ProcessLogits then changes in place). Valid until the next call.
  const float* RawLogits(const Sequence& seq, const float* row);
  // Samples the next token of `seq` (and of the samples it forks now) from its logits row.
  void SampleInto(Sequence* seq, float* logits, const float* raw_logits,
                  std::vector<SequenceUpdate>* updates);
  // Appends `token` (logprobs from `raw_logits` when requested), asks the features (OnToken) and
  // CheckFinish, and finishes the sequence when that says so.
  void AppendToken(Sequence* seq, int32_t token, const float* raw_logits, SequenceUpdate* update);
  // Appends a token the backend sampled on the device (logprobs computed there), as AppendToken.
  void AppendDeviceSample(Sequence* seq, const DeviceSample& sample, SequenceUpdate* update);
  // Overlapped steps: the device's token for `seq`'s last token, which was appended as
  // kPendingToken when its step was left in flight, set in its place; then as AppendToken.
  void ResolvePendingToken(Sequence* seq, const DeviceSample& sample, SequenceUpdate* update);
  // The sampler's processing of `seq`'s next row as data (ProcessLogits' edits, without the
  // features' OnLogits).
  void BuildEdits(const Sequence& seq, LogitEdits* edits);
  // Creates the samples 1..n-1 of `parent` (sharing its blocks, running) and returns them.
  std::vector<Sequence*> Fork(Sequence* parent);
  // Ends `seq`: features' OnFinish, out of the scheduler (blocks freed), the finishing update.
  void Finish(Sequence* seq, FinishReason reason, SequenceUpdate* update);
  // Ends the samples `seq` was still to fork (n > 1, prompt not computed yet): one finished
  // update each, with `reason` and `status`, so every request hears exactly n endings.
  void EndPendingForks(Sequence* seq, FinishReason reason, const absl::Status& status,
                       std::vector<SequenceUpdate>* updates);
  // The first time `seq` is computed or reserved: its prompt and prefix-cache hit are counted.
  void CountAdmission(Sequence* seq);
  // Whether the features accept a token produced elsewhere (EngineFeature::CheckForeignToken).
  absl::Status CheckForeignToken(const Sequence& seq, int32_t token) const;
  // Whether a feature cannot check or take a foreign token now (EngineFeature::
  // ForeignTokenPending).
  bool ForeignTokenPending(const Sequence& seq) const;
  // Drops the requests whose every sample finished (at the end of a step or command).
  void ReapFinished();

 private:
  // AppendToken's work once the logprobs are known.
  // `placed`: the token is already the last of seq->tokens.
  void Append(Sequence* seq, int32_t token, TokenLogprobs logprobs, SequenceUpdate* update,
              bool placed = false);

  EngineOptions options_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<EngineFaultInjector> faults_;
  std::vector<std::unique_ptr<EngineFeature>> features_;
  EngineExtensions extensions_;  // until AddExtensionFeatures
  int next_feature_slot_ = 0;
  EngineWake wake_;
  int64_t max_model_len_ = 0;
  int64_t vocab_size_ = 0;
  std::vector<int32_t> eos_ids_;

  std::unordered_map<std::string, Samples> requests_;
  std::vector<std::string> finished_requests_;  // erased by ReapFinished
  std::vector<SequenceUpdate> pending_updates_;
  int64_t next_seq_id_ = 1;
  uint64_t next_arrival_ = 1;
  Rng seed_source_;
  EngineStats stats_;
  std::vector<int32_t> stop_ids_;  // ProcessLogits scratch
  LogitEdits edits_;               // ProcessLogits scratch
  std::vector<float> raw_logits_;  // RawLogits scratch
};

}  // namespace tandem
