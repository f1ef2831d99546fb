#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/backend/backend.h"
#include "common/engine/engine_faults.h"
#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/model/model.h"
#include "common/engine/sampler/sampler.h"
#include "common/engine/scheduler/scheduler.h"
#include "common/engine/scheduler/sequence.h"
#include "common/engine/spec/proposer.h"
#include "common/engine/spec/spec_options.h"
#include "common/grammar/grammar_compiler.h"
#include "common/metrics/spec_hooks.h"

namespace tandem {

struct EngineOptions {
  SchedulerOptions scheduler;
  bool enable_prefix_cache = true;
  int64_t max_model_len = 0;   // 0: the model's max_position_embeddings
  int64_t max_waiting = 4096;  // queued sequences beyond this: RESOURCE_EXHAUSTED
  int32_t max_n = 16;          // samples per request at most
  uint64_t seed = 0;           // seeds requests that bring none (0: from the clock)
  SpecOptions spec;            // speculative decoding (the proposer is given to Create)
  // Fault injection (engine_faults.h): off unless set here or, with faults_from_env, by the
  // TANDEM_FAULTS environment variable.
  EngineFaultOptions faults;
  bool faults_from_env = true;
  // Structured output: compiles request constraints against the model's vocabulary (built from
  // its tokenizer by BuildEngine). Null: constrained requests are INVALID_ARGUMENT.
  std::shared_ptr<grammar::GrammarCompiler> grammar;
  // Compute grammar masks on a worker thread while the forward pass runs (false: inline).
  bool overlap_grammar_masks = true;
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants one
  SamplingParams params;
  int32_t n = 1;
  int32_t priority = 0;
  std::string cache_salt;
  absl::Time arrival_time = absl::Now();

  // Disaggregation (DESIGN §2). Decode role: reserve blocks for the prompt and wait for its KV
  // from a prefill worker (CompleteRemotePrefill); the reservation expires after kv_lease.
  bool remote_prefill = false;
  absl::Duration kv_lease = absl::Seconds(60);
  // Prefill role: compute the prompt, sample the first token of each sample, finish, and hold
  // the blocks for export until ReleaseHold(id). export_hooks see each layer as it completes.
  bool prefill_only = false;
  std::shared_ptr<KvExportHooks> export_hooks;
  // Migration: tokens already generated (and streamed) elsewhere for this request. They count
  // toward max_tokens and as output for the penalties; the RNG skips their draws. Requires n 1.
  std::vector<int32_t> prior_output;
};

struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

// Decode role: the blocks reserved for a remote-prefill request. blocks covers the whole prompt;
// the first cached_tokens / block_size of them already hold this worker's cached prefix, the
// rest must be filled by the prefill worker.
struct KvReservation {
  std::vector<int32_t> blocks;
  int64_t cached_tokens = 0;
  int64_t num_tokens = 0;  // prompt (+ prior output) tokens covered
  int64_t block_size = 0;
  // Window layout (KvCacheSpec::windowed): the local (sliding-window) layers, whose pages are
  // reserved only for blocks[window_first_block, n) (the window the first decode step sees);
  // the transfer must fill only those of them. Empty without a window layout.
  std::vector<int64_t> window_layers;
  int64_t window_first_block = 0;
};

// What one sequence produced in one step.
struct SequenceUpdate {
  std::string request_id;
  int32_t index = 0;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprobs> logprobs;  // one per new token when requested
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;                       // non-OK with kError
  std::optional<KvReservation> reservation;  // decode role, once, before any token
  std::vector<int32_t> held_blocks;          // prefill role, on the finishing update of sample 0
  // Set on the finishing update:
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  int32_t num_preemptions = 0;
  int64_t spec_accepted_tokens = 0;  // drafted tokens the target accepted
  absl::Duration queue_time;         // arrival -> first scheduled
  absl::Duration prefill_time;       // first scheduled -> first token
  absl::Duration ttft;               // arrival -> first token
  absl::Duration total_time;         // arrival -> finish
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;       // referenced by sequences
  int64_t kv_blocks_cached = 0;     // holding a prefix-cache entry (referenced or not)
  int64_t kv_blocks_evictable = 0;  // cached and unreferenced
  int64_t kv_evictions = 0;         // cached blocks evicted to make room (cumulative)
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;         // admitted prompt tokens
  int64_t prefix_cache_queried = 0;  // prompt tokens looked up at first admission
  int64_t prefix_cache_hit = 0;      // of which found cached
  int64_t generated_tokens = 0;
  int64_t num_awaiting_kv = 0;  // decode role: reservations waiting for their KV
  int64_t kv_blocks_held = 0;   // prefill role: blocks held for export
  // Speculative decoding.
  int64_t spec_verifications = 0;  // sequence-steps that verified a proposal
  int64_t spec_drafted_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_at;  // [i]: proposals whose position i was accepted
  int64_t spec_draft_blocks = 0;          // draft model KV blocks in use
  int64_t kv_reserved_token_slots = 0;    // block slots held by running sequences (and padding)
  int64_t kv_filled_token_slots = 0;      // of which hold computed tokens
  int64_t padding_rows = 0;            // static baseline: rows computed for finished batch members
  int64_t grammar_masks = 0;           // token masks applied (structured output)
  int64_t grammar_drafts_trimmed = 0;  // drafted tokens cut because the grammar forbids them
};

// The inference engine both worker kinds share (DESIGN §4): continuous batching over a paged
// KV cache with prefix caching, chunked prefill, preemption and sampling. It knows nothing of
// RPC. Thread model: NOT thread-safe; one engine thread calls every method (servers put a
// queue in front of it).
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

  // Runs one iteration (schedule, forward, sample) if there is work and returns what changed.
  std::vector<SequenceUpdate> Step();
  // There is something to compute or report now.
  bool HasWork() const;
  // The earliest reservation lease expiry (InfiniteFuture when none): Step() must run by then.
  absl::Time NextDeadline() const;
  EngineStats stats() const;

  // Hears every speculative verification (metrics); may be null, must outlive the engine.
  void set_spec_hooks(SpecHooks* hooks) { spec_hooks_ = hooks; }
  const SpecOptions& spec_options() const { return options_.spec; }

  const Model& model() const { return *model_; }
  Backend& backend() { return *backend_; }
  // What a remote prefill of `num_tokens` positions reserves and transfers of the local layers
  // (KvReservation::window_layers / window_first_block); empty layers without a window layout.
  // Reads only what is fixed at construction: callable from any thread.
  struct TransferWindow {
    std::vector<int64_t> layers;
    int64_t first_block = 0;
  };
  TransferWindow RemoteTransferWindow(int64_t num_tokens) const;
  int64_t max_model_len() const { return max_model_len_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  BlockPool& block_pool() { return *pool_; }

 private:
  Engine(const EngineOptions& options, std::shared_ptr<const Model> model,
         std::unique_ptr<Backend> backend);
  absl::Status Validate(const EngineRequest& request) const;
  // Samples the next token of `seq` from its logits row; returns its update.
  void SampleInto(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates,
                  const float* raw_logits);
  void AppendToken(Sequence* seq, int32_t token, const float* raw_logits, SequenceUpdate* update);
  // Creates the samples 1..n-1 of `parent` (sharing its blocks) and returns them.
  std::vector<Sequence*> Fork(Sequence* parent);
  void Finish(Sequence* seq, FinishReason reason, SequenceUpdate* update);
  // Ends the samples `seq` was still to fork (n > 1, prompt not computed yet): one finished
  // update each, with `reason` and `status`, so every request hears exactly n endings.
  void EndPendingForks(Sequence* seq, FinishReason reason, const absl::Status& status,
                       std::vector<SequenceUpdate>* updates);
  void ExpireLeases(std::vector<SequenceUpdate>* updates);
  void ReapFinished();
  // Speculative decoding (engine_spec.cc).
  void ProposeDrafts();
  void VerifyDrafts(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates);
  void AdaptSpeculation(Sequence* seq, int32_t drafted, int32_t accepted);
  // Structured output (engine_grammar.cc).
  absl::Status AttachGrammar(Sequence* seq, const std::vector<int32_t>& prior_output);
  // Masks the tokens the grammar forbids at `seq`'s state (uses seq->next_mask when set).
  void ApplyGrammarMask(Sequence* seq, float* logits);
  // Cuts each draft at its first token the grammar forbids.
  void TrimDraftsToGrammar();
  // Starts computing the next-token masks of `seqs` (overlapping the forward pass); the returned
  // callable joins.
  std::function<void()> StartGrammarMasks(const std::vector<Sequence*>& seqs);
  void ReportReservations(const SchedulerOutput& plan, std::vector<SequenceUpdate>* updates);
  std::function<void(int64_t)> ExportHook(const SchedulerOutput& plan);
  void CountAdmission(Sequence* seq);
  void FailStep(const absl::Status& status, const SchedulerOutput& plan,
                std::vector<SequenceUpdate>* updates);
  SequenceUpdate& UpdateFor(Sequence* seq, std::vector<SequenceUpdate>* updates);

  EngineOptions options_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Proposer> proposer_;
  std::unique_ptr<EngineFaultInjector> faults_;  // null unless fault injection is on
  SpecHooks* spec_hooks_ = nullptr;
  std::vector<std::string> finished_requests_;  // erased at the end of Step
  int64_t max_model_len_ = 0;
  int64_t vocab_size_ = 0;
  std::vector<int32_t> eos_ids_;

  // request id -> its sequences (owned here).
  std::unordered_map<std::string, std::vector<std::unique_ptr<Sequence>>> requests_;
  std::vector<SequenceUpdate> pending_updates_;  // aborts etc. reported by the next Step()
  std::unordered_map<std::string, SequenceBlocks> holds_;  // prefill role: blocks held
  int64_t held_blocks_ = 0;
  int64_t next_seq_id_ = 1;
  uint64_t next_arrival_ = 1;
  Rng seed_source_;
  EngineStats stats_;
  std::vector<float> logits_;
  std::vector<float> raw_logits_;
};

}  // namespace tandem
