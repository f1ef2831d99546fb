#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

// Cumulative engine counters and current gauges, as the engine reports them after a step (the
// metrics-side mirror of EngineStats, so that this header depends on nothing).
struct EngineCounters {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_cached = 0;
  // Cumulative since the engine started.
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t kv_evictions = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_cache_queried = 0;
  int64_t prefix_cache_hit = 0;
  // Structured output (EngineStats' grammar_* fields): gauges, then cumulative counters.
  struct Grammar {
    int64_t compile_waiting = 0;
    int64_t mask_waiting = 0;
    int64_t queued = 0;
    int64_t running = 0;
    int64_t memory_bytes = 0;
    // Requests by how their grammar came, in kGrammarOutcomes order.
    int64_t outcomes[6] = {0, 0, 0, 0, 0, 0};
    int64_t masks_deferred = 0;
    int64_t mask_budget_exceeded = 0;
  } grammar;
  // LoRA (gauges; loaded -1: LoRA is off).
  int64_t lora_adapters_loaded = -1;
  int64_t lora_adapters_active = 0;
  int64_t lora_requests_held = 0;
};

// The outcome label of tandem_grammar_requests_total, in EngineCounters::Grammar::outcomes order.
inline constexpr const char* kGrammarOutcomes[6] = {"cache_hit", "compiled",        "rejected",
                                                    "invalid",   "budget_exceeded", "cancelled"};

// How one sequence (one sample of a request) ended in the engine.
struct FinishedSequence {
  std::string_view finish_reason;  // stop, length, abort or error (anything else: error)
  bool scheduled = false;          // ran at least once (queue time is then meaningful)
  bool produced_token = false;     // sampled a first token (prefill time is then meaningful)
  double queue_seconds = 0;        // arrival -> first scheduled
  double prefill_seconds = 0;      // first scheduled -> first token
  int64_t cached_prompt_tokens = 0;
  std::string_view lora_adapter;  // the LoRA adapter it ran with (empty: the base model)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double e2e_seconds = 0;  // arrival -> finish
};

// What the engine loop reports (implemented by EngineMetrics). Header-only interface: the
// engine calls it without linking the metrics library. Called on the engine thread; must not
// block.
class EngineHooks {
 public:
  virtual ~EngineHooks() = default;
  // After every step that ran (step_seconds: its wall time) and after applying commands.
  virtual void OnStep(const EngineCounters& counters, double step_seconds) = 0;
  virtual void OnSequenceFinished(const FinishedSequence& finished) = 0;
};

}  // namespace tandem
