#pragma once

// The per-feature state of a Sequence (sequence.h): one struct per feature, each copied as a
// whole when a request's samples fork (ForkSample), so a feature's state never has to be copied
// field by field outside its own definition. Features registered at run time keep theirs in
// FeatureSlots.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/engine/sampler/sampler.h"
#include "common/grammar/compile_service.h"
#include "common/grammar/matcher.h"

namespace tandem {

struct LoraAdapter;  // common/engine/lora/lora_adapter.h

// Speculative decoding (DESIGN §4; spec_feature.cc): this step's proposal, verified after the
// forward pass, and the adaptive draft length.
struct SpecState {
  std::vector<int32_t> draft;
  std::vector<TokenDistribution> draft_q;  // empty: deterministic proposal
  int32_t k = 0;                           // adaptive: tokens to draft next time (0: paused)
  double acceptance = 1.0;                 // moving average of the accepted fraction
  int32_t pause = 0;                       // steps left before probing again
  int64_t accepted = 0;                    // accepted drafted tokens (reported in the usage)

  void ClearDraft() {
    draft.clear();
    draft_q.clear();
  }
};

// Structured output (grammar_feature.cc): the grammar state after the output tokens.
// A constrained sequence may wait (Scheduler::Hold) for its grammar's compilation (kPending),
// for a token mask computed off the engine loop, or for its grammar to be free of such a
// computation (kAwaiting) (engine README "Structured output").
struct GrammarState {
  enum class Wait { kNone, kCompile, kMask, kGrammarBusy };

  std::optional<grammar::GrammarMatcher> matcher;  // empty when unconstrained (or compiling)
  // Masks prepared before this step's plan: (parser state, its mask) for the current state and
  // the states after each drafted token; the rows' masks are looked up here.
  std::vector<std::pair<int32_t, std::shared_ptr<const grammar::TokenMask>>> masks;
  std::string tenant;  // whose CPU the compile service charges (EngineRequest::tenant)
  Wait wait = Wait::kNone;
  std::shared_ptr<grammar::GrammarCompileHandle> handle;  // kCompile, kMask: the work awaited
  // kMask: where the worker puts the mask (read once the handle is ready).
  std::shared_ptr<std::shared_ptr<const grammar::TokenMask>> pending_mask;
  // kGrammarBusy: the prior output (migration) is still to be replayed through the matcher.
  bool replay = false;

  bool active() const { return matcher.has_value(); }
  bool constrained() const { return active() || wait == Wait::kCompile; }
};

// Prefill role: called on the engine thread inside the step that computes the last chunk of the
// prompt, after layer `layer` of that step is written; at that point every block in `blocks`
// (the sequence's whole block table) holds that layer's KV for the entire prompt.
struct KvExportHooks {
  std::function<void(const std::vector<int32_t>& blocks, int64_t layer)> on_layer;
};

// Disaggregation roles (DESIGN §2; disagg_feature.cc).
struct DisaggState {
  bool remote_prefill = false;  // decode role: prompt KV arrives from a prefill worker
  bool prefill_only = false;    // prefill role: stop after the first token, hold blocks for export
  std::shared_ptr<KvExportHooks> export_hooks;         // prefill role, may be null
  absl::Duration kv_lease = absl::Seconds(60);         // reservation lifetime
  absl::Time lease_deadline = absl::InfiniteFuture();  // awaiting its KV: reservation expiry
  bool kv_fence = false;  // decode role: ending before its KV arrived leaves a fence
};

// LoRA (lora_feature.cc): the adapter whose weights the backend adds to this sequence's
// projections (null: the base model), held for as long as the sequence lives, so unloading the
// adapter never frees weights it still reads. Its cache key salts the prefix cache's hashes.
struct LoraState {
  std::shared_ptr<const LoraAdapter> adapter;
  bool held = false;  // waiting for an adapter slot (--max-loras), held by the feature
};

// When the sequence reached each stage (the usage report's durations).
struct SequenceTiming {
  absl::Time arrival;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
};

// Accounting reported with the finishing update and counted in the engine's statistics.
struct SequenceUsage {
  int64_t cached_prompt_tokens = -1;  // prefix-cache hit at first admission; -1 before
  int32_t num_preemptions = 0;
  bool admission_counted = false;  // engine statistics: prefix-cache lookup counted once

  // A sample forked from this one: the same prompt accounting (counted once, by the parent);
  // its own preemptions.
  SequenceUsage ForkedSample() const {
    SequenceUsage u;
    u.cached_prompt_tokens = cached_prompt_tokens;
    u.admission_counted = true;
    return u;
  }
};

// The per-sequence state of a feature registered at run time (EngineOptions::extensions): what
// a feature that is not built into the engine keeps in a sequence. Cloned when a sample forks.
class FeatureState {
 public:
  virtual ~FeatureState() = default;
  virtual std::unique_ptr<FeatureState> Clone() const = 0;
};

// One slot per feature that asks for one (EngineCore::AllocateFeatureSlot); copies clone.
class FeatureSlots {
 public:
  FeatureSlots() = default;
  FeatureSlots(const FeatureSlots& other) { *this = other; }
  FeatureSlots& operator=(const FeatureSlots& other) {
    if (this == &other) return *this;
    slots_.clear();
    for (const auto& s : other.slots_) slots_.push_back(s != nullptr ? s->Clone() : nullptr);
    return *this;
  }
  FeatureSlots(FeatureSlots&&) = default;
  FeatureSlots& operator=(FeatureSlots&&) = default;

  // The state in `slot` as T (null when none was set).
  template <typename T>
  T* get(int slot) const {
    return slot < static_cast<int>(slots_.size()) ? static_cast<T*>(slots_[slot].get()) : nullptr;
  }
  void set(int slot, std::unique_ptr<FeatureState> state) {
    if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
    slots_[slot] = std::move(state);
  }

 private:
  std::vector<std::unique_ptr<FeatureState>> slots_;
};

}  // namespace tandem
