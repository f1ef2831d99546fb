// The engine's step (README "Engine contract") and its construction; admission and endings are
// in engine_requests.cc, the features in *_feature.cc.

#include "common/engine/engine.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/disagg_feature.h"
#include "common/engine/engine_core.h"
#include "common/engine/grammar_feature.h"
#include "common/engine/lora_feature.h"
#include "common/engine/spec_feature.h"
#include "common/engine/tier_feature.h"
#include "common/engine/zero_copy_feature.h"

namespace tandem {

Engine::Engine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       std::shared_ptr<const Model> model,
                                                       std::unique_ptr<Backend> backend,
                                                       std::unique_ptr<Proposer> proposer) {
  if (model == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("engine needs a model and a backend");
  }
  if (options.scheduler.max_num_seqs < 1 || options.scheduler.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  if (options.spec.method != SpecOptions::Method::kNone) {
    if (proposer == nullptr) {
      return absl::InvalidArgumentError("speculative decoding is enabled but no proposer given");
    }
    if (options.spec.num_speculative_tokens < 1 || options.spec.num_speculative_tokens > 16) {
      return absl::InvalidArgumentError("num_speculative_tokens must be in [1, 16]");
    }
  }
  if (options.lora != nullptr) {
    const LoraOptions& lora = options.lora->options();
    if (absl::Status st =
            backend->CheckLora(lora.max_loras, lora.max_lora_rank, lora.resolved_dtype());
        !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("LoRA adapters are not supported on the ",
                                                     backend->name(), " backend: ", st.message()));
    }
  }
  std::unique_ptr<Engine> e(
      new Engine(std::make_unique<EngineCore>(options, std::move(model), std::move(backend))));
  // LoRA first: it salts a request's block hashes at admission, before any other feature or the
  // scheduler looks its prompt up.
  e->core_->AddFeature(std::make_unique<LoraFeature>(options.lora));
  // Then the features, in the order their hooks run: disaggregation (leases expire first, the
  // prefill role's hold is taken before the blocks go), zero-copy destinations (one remote pool
  // per step), speculation (drafts proposed), structured
  // output (then cut to the grammar).
  auto disagg = std::make_unique<DisaggFeature>();
  e->disagg_ = disagg.get();
  e->core_->AddFeature(std::move(disagg));
  e->core_->AddFeature(std::make_unique<ZeroCopyFeature>());
  auto spec = std::make_unique<SpecFeature>(std::move(proposer));
  e->spec_ = spec.get();
  e->core_->AddFeature(std::move(spec));
  e->core_->AddFeature(std::make_unique<GrammarFeature>());
  if (options.kv_tiers.enabled()) {
    // KV cache tiers (tier_feature.h): after the built-in features, so a request a feature holds
    // from admission is not looked up until it waits in the queue.
    if (!options.enable_prefix_cache) {
      return absl::InvalidArgumentError("KV offload tiers need the prefix cache");
    }
    if (e->core_->backend().kv_spec().windowed()) {
      return absl::InvalidArgumentError(
          "KV offload tiers do not support the sliding-window KV layout yet");
    }
    auto tiers = TierFeature::Create(options.kv_tiers, e->core_->backend());
    if (!tiers.ok()) return tiers.status();
    TierFeature* t = tiers->get();
    e->core_->AddFeature(std::move(tiers).value());
    t->Start();
  }
  e->core_->AddExtensionFeatures();
  return e;
}

void Engine::FailStep(const absl::Status& status, const SchedulerOutput& plan,
                      std::vector<SequenceUpdate>* updates) {
  std::vector<Sequence*> seqs;
  for (const ScheduledSeq& s : plan.scheduled) seqs.push_back(s.seq);
  FailSequences(status, seqs, updates);
}

void Engine::FailSequences(const absl::Status& status, const std::vector<Sequence*>& seqs,
                           std::vector<SequenceUpdate>* updates) {
  TLOG(ERROR) << "forward pass failed, failing " << seqs.size() << " sequences: " << status;
  for (Sequence* seq : seqs) {
    if (seq == nullptr || seq->status == SeqStatus::kFinished) continue;
    core_->EndPendingForks(seq, FinishReason::kError, status, updates);
    SequenceUpdate& u = EngineCore::UpdateFor(seq, updates);
    u.status = status;
    core_->Finish(seq, FinishReason::kError, &u);
  }
}

std::vector<SequenceUpdate> Engine::Step() {
  EngineCore& core = *core_;
  Scheduler& scheduler = core.scheduler();
  const auto& features = core.features();
  std::vector<SequenceUpdate> updates = std::move(core.pending_updates());
  core.pending_updates().clear();
  core.wake().Take();
  for (const auto& f : features) f->OnStepBegin(&updates);
  // A step in flight whose tokens this plan needs on the host is collected first (the per-step
  // fallback to the synchronous loop).
  if (inflight_ != nullptr && !CanPlanAhead()) CollectInflight(&updates);
  if (scheduler.idle()) {
    if (inflight_ != nullptr) CollectInflight(&updates);
    core.ReapFinished();
    return updates;
  }

  if (EngineFaultInjector* faults = core.faults(); faults != nullptr) {
    const absl::Duration stall = faults->NextStall();
    if (stall > absl::ZeroDuration()) absl::SleepFor(stall);
  }
  for (const auto& f : features) f->BeforeSchedule();
  SchedulerOutput plan = scheduler.Schedule();
  ++core.stats().steps;
  core.stats().preemptions += static_cast<int64_t>(plan.preempted.size());
  for (Sequence* seq : plan.reserved) core.CountAdmission(seq);
  for (const auto& f : features) f->AfterSchedule(plan, &updates);
  if (plan.scheduled.empty()) {
    if (inflight_ != nullptr) CollectInflight(&updates);
    core.ReapFinished();
    return updates;
  }

  Backend& backend = core.backend();
  for (const BlockCopy& c : plan.block_copies) backend.CopyBlock(c.src, c.dst);

  // Tokens still on the device (the step in flight sampled them): their ids come from there.
  std::unordered_map<const Sequence*, int32_t> on_device;
  if (inflight_ != nullptr) {
    for (size_t i = 0; i < inflight_->sampled.size(); ++i) {
      if (inflight_->sampled[i] != nullptr) {
        on_device[inflight_->sampled[i]] = inflight_->sampling.DeviceIndex(i);
      }
    }
  }
  std::vector<DeviceTokenInput> device_tokens;
  const int64_t block_size = backend.kv_spec().block_size;
  ForwardBatch batch;
  std::vector<Sequence*> sampled;
  std::vector<size_t> first_row;  // of each sampled sequence's logits rows
  size_t num_rows = 0;
  for (const ScheduledSeq& s : plan.scheduled) {
    Sequence* seq = s.seq;
    core.CountAdmission(seq);
    // A speculating decode feeds its last token and the drafted ones, with logits at each.
    const std::vector<int32_t>& draft = seq->spec.draft;
    const int64_t real = s.num_new_tokens - static_cast<int64_t>(draft.size());
    const bool completes = seq->num_computed + real == seq->num_tokens();
    std::vector<int32_t> chunk(seq->tokens.begin() + seq->num_computed,
                               seq->tokens.begin() + seq->num_computed + real);
    for (size_t k = 0; k < chunk.size(); ++k) {
      if (chunk[k] != kPendingToken) continue;
      chunk[k] = 0;  // any valid id: the device's replaces it
      device_tokens.push_back({static_cast<int32_t>(batch.num_tokens() + k), on_device.at(seq)});
    }
    chunk.insert(chunk.end(), draft.begin(), draft.end());
    batch.AddSequenceRows(chunk, static_cast<int32_t>(seq->num_computed), seq->blocks.table,
                          block_size, completes ? 1 + static_cast<int64_t>(draft.size()) : 0);
    batch.seqs.back().local_tables = seq->blocks.local;
    if (completes) {
      sampled.push_back(seq);
      first_row.push_back(num_rows);
      num_rows += 1 + draft.size();
    }
  }
  for (const auto& f : features) f->BeforeForward(plan, sampled, &batch);

  const size_t vocab = static_cast<size_t>(core.vocab_size());
  sampling_.Plan(core, batch, sampled, first_row);
  const bool async = AsyncSteps();
  absl::Status st = async ? sampling_.Launch(backend, batch, device_tokens)
                          : sampling_.Forward(backend, batch, &logits_);
  for (const auto& f : features) f->AfterForward();
  if (!st.ok()) {
    if (inflight_ != nullptr) CollectInflight(&updates);
    FailStep(st, plan, &updates);
    return updates;
  }

  KvCacheManager& kv = core.kv();
  for (const ScheduledSeq& s : plan.scheduled) {
    if (!s.seq->spec.draft.empty()) continue;  // advanced by the feature that verifies them
    s.seq->num_computed += s.num_new_tokens;
  }
  // The step before this one, launched earlier: its tokens, now that this one is on its way.
  // Sequences it finishes drop this step's token (their blocks go back to the pool).
  if (inflight_ != nullptr) CollectInflight(&updates);
  for (const ScheduledSeq& s : plan.scheduled) {
    if (!s.seq->spec.draft.empty() || s.seq->status == SeqStatus::kFinished) continue;
    kv.RegisterFull(s.seq->tokens, s.seq->num_computed, &s.seq->blocks);
  }
  bool collected = !async;
  if (async) {
    bool leave = !batch.on_layer_done && sampling_.host_rows() == 0;
    for (const Sequence* seq : sampled) {
      leave = leave && (seq->status == SeqStatus::kFinished || OverlapSafe(*seq));
    }
    if (leave) {
      // Left in flight: the next step plans with a pending token for each sequence it sampled.
      inflight_ = std::make_unique<InflightStep>();
      std::swap(inflight_->sampling, sampling_);
      for (Sequence* seq : sampled) {
        const bool live = seq->status != SeqStatus::kFinished;
        if (live) seq->tokens.push_back(kPendingToken);
        inflight_->sampled.push_back(live ? seq : nullptr);
      }
      for (const ScheduledSeq& s : plan.scheduled) {
        if (s.seq->status != SeqStatus::kFinished) inflight_->scheduled.push_back(s.seq);
      }
      ++core.stats().overlapped_steps;
    } else {
      st = sampling_.Collect(backend, &logits_);
      if (!st.ok()) {
        FailStep(st, plan, &updates);
        return updates;
      }
      collected = true;
    }
  }
  for (size_t i = 0; collected && i < sampled.size(); ++i) {
    Sequence* seq = sampled[i];
    if (seq->status == SeqStatus::kFinished) continue;  // ended by the step before: discarded
    if (const DeviceSample* d = sampling_.DeviceSampleOf(i); d != nullptr) {
      core.AppendDeviceSample(seq, *d, &EngineCore::UpdateFor(seq, &updates));
      continue;
    }
    float* row = logits_.data() + sampling_.HostRow(i) * vocab;
    const bool taken = std::any_of(features.begin(), features.end(),
                                   [&](const auto& f) { return f->Sample(seq, row, &updates); });
    if (!taken) core.SampleInto(seq, row, core.RawLogits(*seq, row), &updates);
  }
  // Window layout: local pages the next queries cannot see go back to the pool (after
  // verification, so that rolled-back positions never widen the window again).
  for (const ScheduledSeq& s : plan.scheduled) {
    const SeqStatus status = s.seq->status;
    if (status == SeqStatus::kRunning || status == SeqStatus::kAwaiting) {
      kv.TrimWindow(&s.seq->blocks, s.seq->num_computed);
    }
  }
  core.ReapFinished();
  return updates;
}

bool Engine::HasWork() const {
  return inflight_ != nullptr || !core_->scheduler().idle() || !core_->pending_updates().empty() ||
         core_->wake().notified();
}

absl::Time Engine::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& f : core_->features()) next = std::min(next, f->NextDeadline());
  return next;
}

void Engine::set_wake_listener(std::function<void()> listener) {
  core_->wake().set_listener(std::move(listener));
}

EngineStats Engine::stats() const {
  const EngineCore& core = *core_;
  const Scheduler& scheduler = core.scheduler();
  const BlockPool& pool = core.pool();
  EngineStats s = core.stats();
  s.num_running = scheduler.num_running();
  s.num_waiting = scheduler.num_waiting();
  s.num_awaiting_kv = scheduler.num_awaiting();
  s.kv_blocks_total = pool.num_blocks();
  s.kv_blocks_used = pool.num_referenced();
  s.kv_blocks_cached = pool.num_cached();
  s.kv_blocks_evictable = pool.num_evictable();
  s.kv_evictions = pool.num_evictions();
  const int64_t block_size = core.kv().block_size();
  for (const auto& [id, seqs] : core.requests()) {
    for (const auto& seq : seqs) {
      if (seq->status != SeqStatus::kRunning) continue;
      s.kv_reserved_token_slots += static_cast<int64_t>(seq->blocks.table.size()) * block_size;
      s.kv_filled_token_slots += seq->num_computed;
    }
  }
  for (const auto& f : core.features()) f->AddStats(&s);
  return s;
}

void Engine::set_spec_hooks(SpecHooks* hooks) { spec_->set_hooks(hooks); }
const SpecOptions& Engine::spec_options() const { return core_->options().spec; }
const std::shared_ptr<LoraRegistry>& Engine::lora_registry() const { return core_->options().lora; }
const Model& Engine::model() const { return core_->model(); }
Backend& Engine::backend() { return core_->backend(); }
const Backend& Engine::backend() const { return core_->backend(); }
int64_t Engine::max_model_len() const { return core_->max_model_len(); }
const std::vector<int32_t>& Engine::eos_ids() const { return core_->eos_ids(); }
BlockPool& Engine::block_pool() { return core_->pool(); }

Engine::TransferWindow Engine::RemoteTransferWindow(int64_t num_tokens) const {
  TransferWindow w;
  disagg_->TransferWindow(num_tokens, &w.layers, &w.first_block);
  return w;
}

absl::Status Engine::CompleteRemotePrefill(const std::string& request_id,
                                           const std::vector<int32_t>& first_tokens,
                                           const std::vector<TokenLogprobs>& logprobs) {
  return disagg_->CompleteRemotePrefill(request_id, first_tokens, logprobs);
}

void Engine::ReleaseHold(const std::string& request_id) { disagg_->ReleaseHold(request_id); }

void Engine::ReleaseKvFence(uint64_t fence) { disagg_->ReleaseKvFence(fence); }

}  // namespace tandem
