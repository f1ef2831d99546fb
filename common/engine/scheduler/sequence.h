#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/sampler/rng.h"
#include "common/engine/sampler/sampler.h"
#include "common/engine/sampler/sampling_params.h"
#include "common/grammar/matcher.h"

namespace tandem {

enum class SeqStatus {
  kWaiting,     // queued for admission (or preempted)
  kAwaitingKv,  // decode role: blocks reserved, the prompt's KV is on its way from a prefill worker
  kRunning,
  kFinished,
};

enum class FinishReason {
  kNone = 0,
  kStop,    // end-of-sequence token, a stop token id or a stop string
  kLength,  // max_tokens or the model's context length
  kAbort,   // cancelled by the client or the server
  kError,   // failed; see the status
};

const char* FinishReasonName(FinishReason reason);

// Prefill role: called on the engine thread inside the step that computes the last chunk of the
// prompt, after layer `layer` of that step is written; at that point every block in `blocks`
// (the sequence's whole block table) holds that layer's KV for the entire prompt.
struct KvExportHooks {
  std::function<void(const std::vector<int32_t>& blocks, int64_t layer)> on_layer;
};

// One generated sample of a request (a request with n > 1 has n sequences). Owned by the
// engine; the scheduler moves pointers between its queues. Engine thread only.
struct Sequence {
  int64_t seq_id = 0;          // engine-unique
  uint64_t arrival_order = 0;  // admission order of the request (FCFS tie-break)
  std::string request_id;
  int32_t index = 0;          // sample index within the request
  int32_t pending_forks = 0;  // samples to fork from this one once its prompt is computed
  int32_t priority = 0;       // lower value runs first (vLLM convention)

  std::vector<int32_t> tokens;  // prompt followed by output
  int64_t prompt_len = 0;
  int64_t num_computed = 0;  // leading tokens whose KV is in `blocks`
  SequenceBlocks blocks;

  SamplingParams params;
  Rng rng;
  // Structured output: the grammar state after the output tokens (null when unconstrained).
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  std::shared_ptr<const grammar::TokenMask> next_mask;  // computed during this step's forward

  // Disaggregation roles (DESIGN §2).
  bool remote_prefill = false;  // decode role: prompt KV arrives from a prefill worker
  bool prefill_only = false;    // prefill role: stop after the first token, hold blocks for export
  std::shared_ptr<KvExportHooks> export_hooks;         // prefill role, may be null
  absl::Duration kv_lease = absl::Seconds(60);         // reservation lifetime
  absl::Time lease_deadline = absl::InfiniteFuture();  // kAwaitingKv: reservation expiry
  int64_t prior_output = 0;  // tokens generated before a migration (part of `tokens`)

  // Speculative decoding (DESIGN §4): this step's proposal, verified after the forward pass.
  std::vector<int32_t> draft;
  std::vector<TokenDistribution> draft_q;  // empty: deterministic proposal
  int32_t spec_k = 0;                      // adaptive: tokens to draft next time (0: paused)
  double spec_acceptance = 1.0;            // moving average of the accepted fraction
  int32_t spec_pause = 0;                  // steps left before probing again
  int64_t spec_accepted = 0;               // accepted drafted tokens (reported in the usage)
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;

  // Accounting and timing.
  int64_t cached_prompt_tokens = -1;  // prefix-cache hit at first admission; -1 before
  int32_t num_preemptions = 0;
  bool admission_counted = false;  // engine statistics: prefix-cache lookup counted once
  absl::Time arrival_time;
  absl::Time first_scheduled_time = absl::InfinitePast();
  absl::Time first_token_time = absl::InfinitePast();

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output() const { return num_tokens() - prompt_len; }
  // Tokens still to run through the model before the next token can be sampled.
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool is_prefill() const { return num_uncomputed() > 1; }
};

}  // namespace tandem
