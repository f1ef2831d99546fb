#include "common/metrics/engine_metrics.h"

#include "common/metrics/buckets.h"
#include "common/metrics/counter_delta.h"
#include "common/metrics/finish_reason.h"

namespace tandem {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

}  // namespace

EngineMetrics::EngineMetrics(prometheus::Registry* registry, std::string_view role) : role_(role) {
  const prometheus::Labels l = {{"role", role_}};
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry).Add(l);
  };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry).Add(l);
  };
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& b) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry).Add(l, b);
  };
  running_ = gauge("tandem_engine_requests_running",
                   "Sequences in the engine's running batch (scheduled in the last step).");
  waiting_ = gauge("tandem_engine_requests_waiting",
                   "Sequences queued in the engine, waiting for KV blocks or a batch slot.");
  kv_used_ = gauge("tandem_engine_kv_blocks_used", "KV cache blocks referenced by sequences.");
  kv_cached_ = gauge("tandem_engine_kv_blocks_cached",
                     "KV cache blocks holding a prefix-cache entry (referenced or evictable).");
  kv_total_ = gauge("tandem_engine_kv_blocks_capacity", "KV cache blocks in the pool.");
  steps_ = counter("tandem_engine_steps_total", "Engine iterations (forward passes) run.");
  preemptions_ = counter("tandem_engine_preemptions_total",
                         "Sequences preempted (KV blocks freed, to be recomputed) for lack of KV.");
  evictions_ = counter("tandem_engine_kv_evictions_total",
                       "Prefix-cache blocks evicted to make room for new allocations.");
  prompt_tokens_ = counter("tandem_engine_prompt_tokens_total", "Prompt tokens admitted.");
  generation_tokens_ = counter("tandem_engine_generation_tokens_total", "Tokens generated.");
  prefix_queries_ = counter("tandem_engine_prefix_cache_queries_total",
                            "Prompt tokens looked up in the prefix cache at admission.");
  prefix_hits_ = counter("tandem_engine_prefix_cache_hits_total",
                         "Prompt tokens found in the prefix cache at admission.");
  prompt_tokens_cached_ =
      counter("tandem_engine_prompt_tokens_cached_total",
              "Prompt tokens of finished sequences whose KV came from the prefix cache.");
  auto& finished = BuildCounter()
                       .Name("tandem_engine_sequences_finished_total")
                       .Help("Sequences (samples) finished by the engine, by finish reason.")
                       .Register(*registry);
  for (size_t i = 0; i < finished_.size(); ++i) {
    finished_[i] = &finished.Add({{"role", role_}, {"finish_reason", kFinishReasons[i]}});
  }
  step_seconds_ = histogram("tandem_engine_step_duration_seconds",
                            "Wall time of one engine iteration (schedule, forward, sample).",
                            buckets::InterTokenSeconds());
  queue_seconds_ = histogram("tandem_engine_queue_time_seconds",
                             "Time from arrival at the engine to first being scheduled.",
                             buckets::FirstTokenSeconds());
  auto& grammar_waiting =
      BuildGauge()
          .Name("tandem_grammar_requests_waiting")
          .Help(
              "Sequences waiting for their grammar's compilation (reason=compile) or for a "
              "token mask computed off the engine loop (reason=mask).")
          .Register(*registry);
  grammar_compile_waiting_ = &grammar_waiting.Add({{"role", role_}, {"reason", "compile"}});
  grammar_mask_waiting_ = &grammar_waiting.Add({{"role", role_}, {"reason", "mask"}});
  grammar_queued_ = gauge("tandem_grammar_queue_depth",
                          "Grammar compilations and token masks queued for a compile worker.");
  grammar_running_ = gauge("tandem_grammar_jobs_running",
                           "Grammar compilations and token masks on a compile worker now.");
  grammar_memory_ = gauge("tandem_grammar_memory_bytes",
                          "Bytes held by compiled grammars (cached or in use), bounded.");
  auto& outcomes = BuildCounter()
                       .Name("tandem_grammar_requests_total")
                       .Help(
                           "Constrained requests by how their grammar came: from the cache, "
                           "compiled while waiting, refused (queue full), invalid, over the "
                           "CPU budget, cancelled while waiting.")
                       .Register(*registry);
  for (size_t i = 0; i < grammar_outcomes_.size(); ++i) {
    grammar_outcomes_[i] = &outcomes.Add({{"role", role_}, {"outcome", kGrammarOutcomes[i]}});
  }
  grammar_masks_deferred_ =
      counter("tandem_grammar_masks_deferred_total",
              "Token masks too expensive for the engine loop, computed by a compile worker "
              "while their sequence waited.");
  grammar_mask_budget_exceeded_ =
      counter("tandem_grammar_mask_budget_exceeded_total",
              "Token masks cut at the grammar CPU budget (their sequence failed).");
  prefill_seconds_ = histogram("tandem_engine_prefill_time_seconds",
                               "Time from first being scheduled to the first sampled token.",
                               buckets::RequestSeconds());
  lora_gauges_ = &BuildGauge()
                      .Name("tandem_lora_adapters")
                      .Help(
                          "LoRA adapters: loaded (state=loaded), with admitted requests "
                          "(state=active, at most --max-loras), and requests waiting for an "
                          "adapter slot (state=requests_waiting).")
                      .Register(*registry);
  lora_finished_ = &BuildCounter()
                        .Name("tandem_lora_sequences_finished_total")
                        .Help("Sequences finished with a LoRA adapter, by adapter.")
                        .Register(*registry);
  lora_prompt_tokens_ = &BuildCounter()
                             .Name("tandem_lora_prompt_tokens_total")
                             .Help("Prompt tokens of finished sequences, by LoRA adapter.")
                             .Register(*registry);
  lora_generation_tokens_ = &BuildCounter()
                                 .Name("tandem_lora_generation_tokens_total")
                                 .Help("Tokens generated with a LoRA adapter, by adapter.")
                                 .Register(*registry);
  lora_e2e_seconds_ = &BuildHistogram()
                           .Name("tandem_lora_e2e_seconds")
                           .Help("Arrival to finish of sequences with a LoRA adapter.")
                           .Register(*registry);
}

EngineMetrics::LoraSeries& EngineMetrics::LoraSeriesFor(std::string_view adapter) {
  auto it = lora_series_.find(adapter);
  if (it != lora_series_.end()) return it->second;
  const std::string label =
      lora_series_.size() < kMaxLoraLabels ? std::string(adapter) : std::string("other");
  if (auto other = lora_series_.find(label); other != lora_series_.end()) return other->second;
  const prometheus::Labels l = {{"role", role_}, {"lora_adapter", label}};
  LoraSeries s{&lora_finished_->Add(l), &lora_prompt_tokens_->Add(l),
               &lora_generation_tokens_->Add(l),
               &lora_e2e_seconds_->Add(l, buckets::RequestSeconds())};
  return lora_series_.emplace(label, s).first->second;
}

void EngineMetrics::Update(const EngineCounters& now) {
  running_->Set(static_cast<double>(now.num_running));
  waiting_->Set(static_cast<double>(now.num_waiting));
  kv_used_->Set(static_cast<double>(now.kv_blocks_used));
  kv_cached_->Set(static_cast<double>(now.kv_blocks_cached));
  kv_total_->Set(static_cast<double>(now.kv_blocks_total));
  std::lock_guard<std::mutex> lock(mu_);
  AddCounterDelta(steps_, now.steps, last_.steps);
  AddCounterDelta(preemptions_, now.preemptions, last_.preemptions);
  AddCounterDelta(evictions_, now.kv_evictions, last_.kv_evictions);
  AddCounterDelta(prompt_tokens_, now.prompt_tokens, last_.prompt_tokens);
  AddCounterDelta(generation_tokens_, now.generated_tokens, last_.generated_tokens);
  AddCounterDelta(prefix_queries_, now.prefix_cache_queried, last_.prefix_cache_queried);
  AddCounterDelta(prefix_hits_, now.prefix_cache_hit, last_.prefix_cache_hit);
  const EngineCounters::Grammar& g = now.grammar;
  grammar_compile_waiting_->Set(static_cast<double>(g.compile_waiting));
  grammar_mask_waiting_->Set(static_cast<double>(g.mask_waiting));
  grammar_queued_->Set(static_cast<double>(g.queued));
  grammar_running_->Set(static_cast<double>(g.running));
  grammar_memory_->Set(static_cast<double>(g.memory_bytes));
  for (size_t i = 0; i < grammar_outcomes_.size(); ++i) {
    AddCounterDelta(grammar_outcomes_[i], g.outcomes[i], last_.grammar.outcomes[i]);
  }
  AddCounterDelta(grammar_masks_deferred_, g.masks_deferred, last_.grammar.masks_deferred);
  AddCounterDelta(grammar_mask_budget_exceeded_, g.mask_budget_exceeded,
                  last_.grammar.mask_budget_exceeded);
  if (now.lora_adapters_loaded >= 0) {
    if (lora_loaded_ == nullptr) {
      lora_loaded_ = &lora_gauges_->Add({{"role", role_}, {"state", "loaded"}});
      lora_active_ = &lora_gauges_->Add({{"role", role_}, {"state", "active"}});
      lora_held_ = &lora_gauges_->Add({{"role", role_}, {"state", "requests_waiting"}});
    }
    lora_loaded_->Set(static_cast<double>(now.lora_adapters_loaded));
    lora_active_->Set(static_cast<double>(now.lora_adapters_active));
    lora_held_->Set(static_cast<double>(now.lora_requests_held));
  }
  last_ = now;
}

void EngineMetrics::ObserveStep(double seconds) { step_seconds_->Observe(seconds); }

void EngineMetrics::OnStep(const EngineCounters& counters, double step_seconds) {
  Update(counters);
  if (step_seconds >= 0) ObserveStep(step_seconds);
}

void EngineMetrics::OnSequenceFinished(const FinishedSequence& f) {
  finished_[FinishReasonIndex(f.finish_reason)]->Increment();
  if (f.scheduled) queue_seconds_->Observe(f.queue_seconds);
  if (f.produced_token) prefill_seconds_->Observe(f.prefill_seconds);
  if (f.cached_prompt_tokens > 0) {
    prompt_tokens_cached_->Increment(static_cast<double>(f.cached_prompt_tokens));
  }
  if (!f.lora_adapter.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    LoraSeries& s = LoraSeriesFor(f.lora_adapter);
    s.finished->Increment();
    s.prompt_tokens->Increment(static_cast<double>(f.prompt_tokens));
    s.generation_tokens->Increment(static_cast<double>(f.completion_tokens));
    s.e2e_seconds->Observe(f.e2e_seconds);
  }
}

void RegisterBackendInfo(prometheus::Registry* registry, std::string_view role,
                         const std::string& backend,
                         const std::vector<std::pair<std::string, std::string>>& labels) {
  prometheus::Labels l = {{"role", std::string(role)}, {"backend", backend}};
  for (const auto& [name, value] : labels) l[name] = value;
  BuildGauge()
      .Name("tandem_backend_info")
      .Help(
          "Constant 1, labelled with how the engine's backend computes (CPU: the kernels' "
          "instruction-set tier and MatMul input dtype).")
      .Register(*registry)
      .Add(l)
      .Set(1);
}

}  // namespace tandem
