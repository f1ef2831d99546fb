#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/engine/engine_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of one inference engine (DESIGN §7), every series labelled with the worker
// role (prefill, decode or both). Declared once here; the engine loop feeds it through the
// EngineHooks interface (AsyncEngine takes an EngineHooks*). Thread-safe.
//
//   tandem_engine_requests_running / _waiting          gauges
//   tandem_engine_kv_blocks_used / _cached / _capacity gauges
//   tandem_engine_steps_total, tandem_engine_step_duration_seconds
//   tandem_engine_preemptions_total, tandem_engine_kv_evictions_total
//   tandem_engine_prompt_tokens_total, tandem_engine_generation_tokens_total
//   tandem_engine_prefix_cache_queries_total, tandem_engine_prefix_cache_hits_total (tokens)
//   tandem_engine_prompt_tokens_cached_total           prompt tokens served from the cache
//   tandem_engine_sequences_finished_total{finish_reason}
//   tandem_engine_queue_time_seconds, tandem_engine_prefill_time_seconds
//   tandem_grammar_requests_waiting{reason=compile|mask}  gauge (structured output)
//   tandem_grammar_queue_depth, tandem_grammar_jobs_running, tandem_grammar_memory_bytes  gauges
//   tandem_grammar_requests_total{outcome}  cache_hit, compiled, rejected, invalid,
//                                           budget_exceeded, cancelled
//   tandem_grammar_masks_deferred_total, tandem_grammar_mask_budget_exceeded_total
//   tandem_backend_info{backend, simd, matmul_input_dtype}  constant 1 (RegisterBackendInfo)
//   LoRA (series only with LoRA on):
//   tandem_lora_adapters_loaded / _active, tandem_lora_requests_waiting   gauges
//   tandem_lora_sequences_finished_total{lora_adapter}, tandem_lora_prompt_tokens_total{..},
//   tandem_lora_generation_tokens_total{..}, tandem_lora_e2e_seconds{..}: per adapter, the
//   first kMaxLoraLabels adapter names seen, the rest as lora_adapter="other" (bounded)
class EngineMetrics : public EngineHooks {
 public:
  static constexpr size_t kMaxLoraLabels = 64;

  EngineMetrics(prometheus::Registry* registry, std::string_view role);
  EngineMetrics(const EngineMetrics&) = delete;
  EngineMetrics& operator=(const EngineMetrics&) = delete;

  // Sets the gauges and adds the counters' increase since the previous call (a counter that
  // goes backwards, e.g. after an engine restart, is taken as restarted from zero).
  void Update(const EngineCounters& now);
  void ObserveStep(double seconds);
  void OnSequenceFinished(const FinishedSequence& finished) override;
  // EngineHooks: Update(counters) and, when a step ran (step_seconds >= 0), ObserveStep.
  void OnStep(const EngineCounters& counters, double step_seconds) override;

  const std::string& role() const { return role_; }

 private:
  std::string role_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_cached_;
  prometheus::Gauge* kv_total_;
  prometheus::Counter* steps_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* evictions_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* prompt_tokens_cached_;
  std::array<prometheus::Counter*, 4> finished_;  // stop, length, abort, error
  prometheus::Histogram* step_seconds_;
  prometheus::Histogram* queue_seconds_;
  prometheus::Histogram* prefill_seconds_;
  prometheus::Gauge* grammar_compile_waiting_;
  prometheus::Gauge* grammar_mask_waiting_;
  prometheus::Gauge* grammar_queued_;
  prometheus::Gauge* grammar_running_;
  prometheus::Gauge* grammar_memory_;
  std::array<prometheus::Counter*, 6> grammar_outcomes_;
  prometheus::Counter* grammar_masks_deferred_;
  prometheus::Counter* grammar_mask_budget_exceeded_;

  // LoRA: the families (series made on first use), the gauges once LoRA is seen on.
  struct LoraSeries {
    prometheus::Counter* finished;
    prometheus::Counter* prompt_tokens;
    prometheus::Counter* generation_tokens;
    prometheus::Histogram* e2e_seconds;
  };
  LoraSeries& LoraSeriesFor(std::string_view adapter);  // mu_ held
  prometheus::Family<prometheus::Gauge>* lora_gauges_;
  prometheus::Family<prometheus::Counter>* lora_finished_;
  prometheus::Family<prometheus::Counter>* lora_prompt_tokens_;
  prometheus::Family<prometheus::Counter>* lora_generation_tokens_;
  prometheus::Family<prometheus::Histogram>* lora_e2e_seconds_;
  prometheus::Gauge* lora_loaded_ = nullptr;
  prometheus::Gauge* lora_active_ = nullptr;
  prometheus::Gauge* lora_held_ = nullptr;
  std::map<std::string, LoraSeries, std::less<>> lora_series_;

  std::mutex mu_;
  EngineCounters last_;
};

// Registers tandem_backend_info{role, backend, <labels>} = 1: how the engine's backend computes
// (for the CPU backend, CpuBackend::InfoLabels: its kernels' tier "simd" and
// "matmul_input_dtype").
void RegisterBackendInfo(prometheus::Registry* registry, std::string_view role,
                         const std::string& backend,
                         const std::vector<std::pair<std::string, std::string>>& labels);

}  // namespace tandem
