#include "common/metrics/engine_metrics.h"

#include <gtest/gtest.h>

#include "common/metrics/finish_reason.h"
#include "common/metrics/metric_reader.h"

namespace tandem {
namespace {

TEST(EngineMetricsTest, GaugesFollowTheLatestUpdate) {
  prometheus::Registry registry;
  EngineMetrics metrics(&registry, "decode");
  EngineCounters c;
  c.num_running = 3;
  c.num_waiting = 2;
  c.kv_blocks_total = 100;
  c.kv_blocks_used = 40;
  c.kv_blocks_cached = 25;
  metrics.Update(c);
  const prometheus::Labels role = {{"role", "decode"}};
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_running", role), 3);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_waiting", role), 2);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_kv_blocks_capacity", role), 100);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_kv_blocks_used", role), 40);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_kv_blocks_cached", role), 25);
  c.num_running = 0;
  c.kv_blocks_used = 0;
  metrics.Update(c);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_running", role), 0);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_kv_blocks_used", role), 0);
}

TEST(EngineMetricsTest, CountersAddTheIncreaseOfCumulativeStats) {
  prometheus::Registry registry;
  EngineMetrics metrics(&registry, "both");
  EngineCounters c;
  c.steps = 10;
  c.prompt_tokens = 100;
  c.generated_tokens = 7;
  c.prefix_cache_queried = 100;
  c.prefix_cache_hit = 32;
  c.preemptions = 1;
  c.kv_evictions = 2;
  metrics.Update(c);
  c.steps = 15;
  c.generated_tokens = 12;
  metrics.Update(c);
  metrics.Update(c);  // no change, no increase
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_steps_total"), 15);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_prompt_tokens_total"), 100);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_generation_tokens_total"), 12);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_prefix_cache_queries_total"), 100);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_prefix_cache_hits_total"), 32);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_preemptions_total"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_kv_evictions_total"), 2);
  // A cumulative value that goes backwards restarted from zero: its new value is the increase.
  c.steps = 3;
  metrics.Update(c);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_steps_total"), 18);
}

TEST(EngineMetricsTest, FinishedSequencesByReasonWithTimings) {
  prometheus::Registry registry;
  EngineMetrics metrics(&registry, "both");
  // Every finish reason exists from the start, at zero.
  for (const char* reason : kFinishReasons) {
    EXPECT_EQ(
        ReadMetric(registry, "tandem_engine_sequences_finished_total", {{"finish_reason", reason}}),
        0)
        << reason;
  }
  metrics.OnSequenceFinished({"stop", true, true, 0.02, 0.5, 16});
  metrics.OnSequenceFinished({"length", true, true, 0.04, 0.25, 0});
  metrics.OnSequenceFinished({"abort", false, false, 3.0, 0, 0});  // aborted while queued
  metrics.OnSequenceFinished({"something-new", false, false, 0, 0, 0});
  EXPECT_EQ(
      ReadMetric(registry, "tandem_engine_sequences_finished_total", {{"finish_reason", "stop"}}),
      1);
  EXPECT_EQ(
      ReadMetric(registry, "tandem_engine_sequences_finished_total", {{"finish_reason", "error"}}),
      1);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_sequences_finished_total"), 4);
  auto queue = ReadHistogram(registry, "tandem_engine_queue_time_seconds");
  ASSERT_TRUE(queue.has_value());
  EXPECT_EQ(queue->count, 2u);
  EXPECT_DOUBLE_EQ(queue->sum, 0.06);
  auto prefill = ReadHistogram(registry, "tandem_engine_prefill_time_seconds");
  ASSERT_TRUE(prefill.has_value());
  EXPECT_EQ(prefill->count, 2u);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_prompt_tokens_cached_total"), 16);
  metrics.ObserveStep(0.003);
  EXPECT_EQ(ReadHistogram(registry, "tandem_engine_step_duration_seconds")->count, 1u);
}

TEST(EngineMetricsTest, LoraSeriesPerAdapterWithBoundedLabels) {
  prometheus::Registry registry;
  EngineMetrics metrics(&registry, "both");
  EngineCounters off;  // LoRA off: no LoRA gauge series
  metrics.Update(off);
  EXPECT_FALSE(ReadMetric(registry, "tandem_lora_adapters", {{"state", "loaded"}}).has_value());
  EngineCounters on;
  on.lora_adapters_loaded = 3;
  on.lora_adapters_active = 2;
  on.lora_requests_held = 5;
  metrics.Update(on);
  EXPECT_EQ(ReadMetric(registry, "tandem_lora_adapters", {{"state", "loaded"}}), 3);
  EXPECT_EQ(ReadMetric(registry, "tandem_lora_adapters", {{"state", "active"}}), 2);
  EXPECT_EQ(ReadMetric(registry, "tandem_lora_adapters", {{"state", "requests_waiting"}}), 5);
  FinishedSequence f;
  f.finish_reason = "length";
  f.prompt_tokens = 7;
  f.completion_tokens = 3;
  f.e2e_seconds = 0.5;
  metrics.OnSequenceFinished(f);  // the base model: no LoRA series
  EXPECT_FALSE(ReadMetric(registry, "tandem_lora_sequences_finished_total").has_value());
  // More adapter names than the label bound: the first kMaxLoraLabels, then "other".
  std::vector<std::string> names;
  for (size_t i = 0; i < EngineMetrics::kMaxLoraLabels + 5; ++i) {
    names.push_back("adapter-" + std::to_string(i));
  }
  for (const std::string& name : names) {
    f.lora_adapter = name;
    metrics.OnSequenceFinished(f);
  }
  f.lora_adapter = names[0];
  metrics.OnSequenceFinished(f);
  EXPECT_EQ(
      ReadMetric(registry, "tandem_lora_sequences_finished_total", {{"lora_adapter", "adapter-0"}}),
      2);
  EXPECT_EQ(
      ReadMetric(registry, "tandem_lora_generation_tokens_total", {{"lora_adapter", "adapter-0"}}),
      6);
  EXPECT_EQ(ReadMetric(registry, "tandem_lora_prompt_tokens_total",
                       {{"lora_adapter", names[EngineMetrics::kMaxLoraLabels - 1]}}),
            7);
  EXPECT_EQ(
      ReadMetric(registry, "tandem_lora_sequences_finished_total", {{"lora_adapter", "other"}}), 5);
  EXPECT_FALSE(
      ReadMetric(registry, "tandem_lora_sequences_finished_total", {{"lora_adapter", names.back()}})
          .has_value());
  EXPECT_EQ(ReadMetric(registry, "tandem_lora_sequences_finished_total"),
            static_cast<double>(names.size() + 1));
  EXPECT_EQ(ReadHistogram(registry, "tandem_lora_e2e_seconds")->count, names.size() + 1);
}

TEST(EngineMetricsTest, HooksInterface) {
  prometheus::Registry registry;
  EngineMetrics metrics(&registry, "both");
  EngineHooks* hooks = &metrics;  // what AsyncEngine holds
  EngineCounters c;
  c.steps = 1;
  c.num_running = 2;
  hooks->OnStep(c, 0.004);
  c.steps = 1;
  hooks->OnStep(c, -1);  // commands applied, no step ran
  hooks->OnSequenceFinished({"length", true, true, 0.01, 0.02, 0});
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_steps_total"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_running"), 2);
  EXPECT_EQ(ReadHistogram(registry, "tandem_engine_step_duration_seconds")->count, 1u);
  EXPECT_EQ(
      ReadMetric(registry, "tandem_engine_sequences_finished_total", {{"finish_reason", "length"}}),
      1);
}

TEST(EngineMetricsTest, TwoRolesShareOneRegistry) {
  prometheus::Registry registry;
  EngineMetrics prefill(&registry, "prefill");
  EngineMetrics decode(&registry, "decode");
  EngineCounters c;
  c.num_waiting = 5;
  prefill.Update(c);
  c.num_waiting = 1;
  decode.Update(c);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_waiting", {{"role", "prefill"}}), 5);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_waiting", {{"role", "decode"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_engine_requests_waiting"), 6);
}

}  // namespace
}  // namespace tandem
