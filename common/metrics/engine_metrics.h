#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Cumulative engine counters and current gauges, as the engine reports them after a step (a
// metrics-side mirror of EngineStats, so this module does not depend on the engine).
struct EngineCounters {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_cached = 0;
  // Cumulative since the engine started; EngineMetrics adds the increase since the last call.
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t kv_evictions = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_cache_queried = 0;
  int64_t prefix_cache_hit = 0;
};

// How one sequence (one sample of a request) ended in the engine.
struct FinishedSequence {
  std::string_view finish_reason;  // stop, length, abort or error (anything else: error)
  bool scheduled = false;          // ran at least once (queue time is then meaningful)
  bool produced_token = false;     // sampled a first token (prefill time is then meaningful)
  double queue_seconds = 0;        // arrival -> first scheduled
  double prefill_seconds = 0;      // first scheduled -> first token
  int64_t cached_prompt_tokens = 0;
};

// Metric families of one inference engine (DESIGN §7), every series labelled with the worker
// role (prefill, decode or both). Declared once here; the engine loop feeds it through the
// hooks below. Thread-safe.
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
class EngineMetrics {
 public:
  EngineMetrics(prometheus::Registry* registry, std::string_view role);
  EngineMetrics(const EngineMetrics&) = delete;
  EngineMetrics& operator=(const EngineMetrics&) = delete;

  // Sets the gauges and adds the counters' increase since the previous call (a counter that
  // goes backwards, e.g. after an engine restart, is taken as restarted from zero).
  void Update(const EngineCounters& now);
  void ObserveStep(double seconds);
  void OnSequenceFinished(const FinishedSequence& finished);

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

  std::mutex mu_;
  EngineCounters last_;
};

}  // namespace tandem
