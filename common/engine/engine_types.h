#pragma once

// The engine's value types: its options, a request, what a step reports and the statistics
// (engine.h is the facade that takes and returns them).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/engine/backend/backend.h"
#include "common/engine/engine_faults.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/kv/tiers/tier_options.h"
#include "common/engine/sampler/sampler.h"
#include "common/engine/sampler/sampling_params.h"
#include "common/engine/scheduler/scheduler.h"
#include "common/engine/scheduler/sequence.h"
#include "common/engine/spec/spec_options.h"
#include "common/grammar/compile_service.h"
#include "common/grammar/grammar_compiler.h"

namespace tandem {

struct EngineExtensions;
class LoraRegistry;  // common/engine/lora/lora_registry.h
// Fills `out` with what a binary adds to an engine (engine_feature.h: EngineExtensions).
using EngineExtensionFactory = std::function<void(KvCacheManager* kv, EngineExtensions* out)>;

struct EngineOptions {
  SchedulerOptions scheduler;
  bool enable_prefix_cache = true;
  int64_t max_model_len = 0;   // 0: the model's max_position_embeddings
  int64_t max_waiting = 4096;  // queued sequences beyond this: RESOURCE_EXHAUSTED
  int32_t max_n = 16;          // samples per request at most
  uint64_t seed = 0;           // seeds requests that bring none (0: from the clock)
  // Sample on the device where the backend can (Backend::SupportsDeviceSampling; README
  // "Sampling on the device"); false: every logits row comes back to the host sampler.
  bool device_sampling = true;
  // Overlapped steps (vLLM's --async-scheduling; README "Overlapped steps"): on a backend that
  // launches steps asynchronously (Backend::SupportsAsyncSteps: CUDA), the next step is planned
  // and launched before this one's tokens reach the host, step by step where nothing needs them
  // there first. No effect on the CPU backend, or with speculative decoding.
  bool async_scheduling = true;
  SpecOptions spec;  // speculative decoding (the proposer is given to Create)
  // Fault injection (engine_faults.h): off unless set here or, with faults_from_env, by the
  // TANDEM_FAULTS environment variable.
  EngineFaultOptions faults;
  bool faults_from_env = true;
  // Structured output: compiles request constraints against the model's vocabulary (built from
  // its tokenizer by BuildEngine). Null: constrained requests are INVALID_ARGUMENT.
  std::shared_ptr<grammar::GrammarCompiler> grammar;
  // Compilations and expensive token masks run off the engine loop on this service's workers,
  // fair across tenants, each within a CPU budget (README "Structured output"). Null: the
  // engine makes one over `grammar` with `grammar_compile`.
  std::shared_ptr<grammar::GrammarCompileService> grammar_service;
  grammar::GrammarCompileServiceOptions grammar_compile;
  // CPU time the engine thread may spend computing one token mask before the plan; a mask that
  // needs more (or whose grammar already had one that did) is computed by grammar_service while
  // its sequence waits, and the other sequences keep stepping. <= 0: always off the loop.
  int64_t grammar_mask_inline_us = 2000;
  // And at most this much in one step, all sequences together (the rest wait off the loop), so
  // many sequences' moderately expensive masks cannot add up to a stall either.
  int64_t grammar_mask_step_us = 10000;
  // Extensions a binary adds to every engine it builds (engine_feature.h: EngineExtensions):
  // called once per engine, after its KV cache manager exists and before its scheduler is
  // made. Null: none.
  EngineExtensionFactory extensions;
  // KV cache tiers below the pool (host memory, local disk; tier_feature.h). Default: off.
  KvTierOptions kv_tiers;
  // LoRA adapters (lora_feature.h): requests select one by EngineRequest::lora_name. Null: LoRA
  // is off and a request naming an adapter is refused.
  std::shared_ptr<LoraRegistry> lora;
};

// Prefill role, zero-copy (kvtransfer/README.md "Zero-copy on one GPU"; zero_copy_feature.h):
// the blocks of a prompt from `first_block` on are `blocks` of `pool` (a decode worker's pool
// mapped here), into which the engine writes their KV directly; this worker's pool holds only
// the blocks before first_block (its prefix-cache hits, or blocks it computes).
struct KvDestination {
  int64_t first_block = 0;
  std::vector<int32_t> blocks;  // the receiver's block ids, for blocks [first_block, n)
  std::shared_ptr<const RemoteKvPool> pool;
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants one
  SamplingParams params;
  int32_t n = 1;
  int32_t priority = 0;
  std::string cache_salt;
  // Who asked (the API key's tenant; "" without keys): the grammar compile service shares its
  // workers fairly between tenants and charges each one's grammar work to it.
  std::string tenant;
  // The LoRA adapter to run the request with, by its registry name (empty: the base model).
  std::string lora_name;
  absl::Time arrival_time = absl::Now();

  // Disaggregation (DESIGN §2). Decode role: reserve blocks for the prompt and wait for its KV
  // from a prefill worker (CompleteRemotePrefill); the reservation expires after kv_lease.
  bool remote_prefill = false;
  absl::Duration kv_lease = absl::Seconds(60);
  // Decode role, with remote_prefill: a request that ends before its KV arrived keeps its
  // reserved blocks out of the free list (a fence, named by its finishing update's kv_fence)
  // until ReleaseKvFence, because a transport may still be writing them (a cancelled transfer's
  // copies in flight). Off: they are freed at once.
  bool kv_fence = false;
  // Prefill role: compute the prompt, sample the first token of each sample, finish, and hold
  // the blocks for export until ReleaseHold(id). export_hooks see each layer as it completes.
  bool prefill_only = false;
  std::shared_ptr<KvExportHooks> export_hooks;
  // Prefill role: write the KV past kv_destination->first_block straight into the decode
  // worker's blocks (requires prefill_only and a backend that SupportsRemoteKv). Null: copying.
  std::shared_ptr<const KvDestination> kv_destination;
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
  // The cache key of the request's LoRA adapter (0: the base model): the KV must be computed
  // with that adapter.
  uint64_t lora_cache_key = 0;
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
  // Decode role (EngineRequest::kv_fence), on the finishing update of sample 0 of a request
  // that ended before its KV arrived: the fence holding its blocks until ReleaseKvFence (0: none).
  uint64_t kv_fence = 0;
  // Set on the finishing update:
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  int32_t num_preemptions = 0;
  int64_t spec_accepted_tokens = 0;  // drafted tokens the target accepted
  std::string lora_name;             // the LoRA adapter it ran with (empty: the base model)
  absl::Duration queue_time;         // arrival -> first scheduled
  absl::Duration prefill_time;       // first scheduled -> first token
  absl::Duration ttft;               // arrival -> first token
  absl::Duration total_time;         // arrival -> finish
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;  // not admitted yet (pending ones, waiting for a resource, included)
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;       // referenced by sequences
  int64_t kv_blocks_cached = 0;     // holding a prefix-cache entry (referenced or not)
  int64_t kv_blocks_evictable = 0;  // cached and unreferenced
  int64_t kv_evictions = 0;         // cached blocks evicted to make room (cumulative)
  int64_t steps = 0;
  // Steps left in flight: the next step was planned and launched before their tokens reached the
  // host (EngineOptions::async_scheduling).
  int64_t overlapped_steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;         // admitted prompt tokens
  int64_t prefix_cache_queried = 0;  // prompt tokens looked up at first admission
  int64_t prefix_cache_hit = 0;      // of which found cached
  int64_t generated_tokens = 0;
  // Admitted but waiting for an external resource (kAwaiting): on a decode worker, the
  // reservations waiting for their KV.
  int64_t num_awaiting_kv = 0;
  int64_t kv_blocks_held = 0;  // prefill role: blocks held for export; decode role: fenced
  // LoRA: adapters loaded (-1: LoRA off), adapters with admitted requests (at most max_loras),
  // and requests held waiting for one of those slots.
  int64_t lora_adapters_loaded = -1;
  int64_t lora_active_adapters = 0;
  int64_t lora_requests_held = 0;
  // Speculative decoding.
  int64_t spec_verifications = 0;  // sequence-steps that verified a proposal
  int64_t spec_drafted_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_at;  // [i]: proposals whose position i was accepted
  int64_t spec_draft_blocks = 0;          // draft model KV blocks in use
  // Block slots held by running sequences (and features that hold blocks of their own), and of
  // those the slots that hold computed tokens.
  int64_t kv_reserved_token_slots = 0;
  int64_t kv_filled_token_slots = 0;
  int64_t grammar_masks = 0;           // token masks applied (structured output)
  int64_t grammar_drafts_trimmed = 0;  // drafted tokens cut because the grammar forbids them
  // Structured output off the engine loop (grammar_feature.h). Sequences waiting now: for their
  // grammar's compilation (kPending, also in num_waiting), or for a token mask computed off the
  // loop or for their grammar to finish one (kAwaiting, not in num_awaiting_kv).
  int64_t grammar_compile_waiting = 0;
  int64_t grammar_mask_waiting = 0;
  // Requests with a constraint, by how their grammar came (cumulative): from the cache at once,
  // compiled while they waited, refused at once (too many pending: RESOURCE_EXHAUSTED), failed
  // (invalid), cut at the CPU budget, cancelled while waiting.
  int64_t grammar_cache_hits = 0;
  int64_t grammar_compiled = 0;
  int64_t grammar_rejected = 0;
  int64_t grammar_invalid = 0;
  int64_t grammar_budget_exceeded = 0;
  int64_t grammar_cancelled = 0;
  // Token masks computed off the loop (a sequence waited for each), and of those cut at the
  // budget (the sequence failed).
  int64_t grammar_masks_deferred = 0;
  int64_t grammar_mask_budget_exceeded = 0;
  // The compile service now: compilations and mask tasks queued, running; grammar memory bytes.
  int64_t grammar_queued = 0;
  int64_t grammar_running = 0;
  int64_t grammar_memory_bytes = 0;
  KvTierStats kv_tiers;  // KV cache tiers (enabled false: none)
};

}  // namespace tandem
