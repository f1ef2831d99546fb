#include "common/engine/engine_core.h"

#include <algorithm>
#include <utility>

#include "common/base/log.h"
#include "common/engine/finish_check.h"

namespace tandem {

EngineCore::EngineCore(const EngineOptions& options, std::shared_ptr<const Model> model,
                       std::unique_ptr<Backend> backend)
    : options_(options), model_(std::move(model)), backend_(std::move(backend)) {
  const ModelConfig& c = model_->config();
  const KvCacheSpec& spec = backend_->kv_spec();
  pool_ = std::make_unique<BlockPool>(spec.num_blocks, options.enable_prefix_cache);
  KvWindow window;
  if (spec.windowed()) window = {spec.sliding_window, spec.num_local_groups()};
  Backend* backend_ptr = backend_.get();
  kv_ = std::make_unique<KvCacheManager>(pool_.get(), spec.block_size, window,
                                         [backend_ptr](int32_t block, int64_t group, int32_t page) {
                                           backend_ptr->MapLocalPage(block, group, page);
                                         });
  if (options.extensions) options.extensions(kv_.get(), &extensions_);
  scheduler_ =
      std::make_unique<Scheduler>(options.scheduler, kv_.get(), std::move(extensions_.batching));
  const EngineFaultOptions faults =
      ResolveEngineFaultOptions(options.faults, options.faults_from_env);
  if (faults.enabled()) {
    faults_ = std::make_unique<EngineFaultInjector>(faults);
    if (faults.alloc_fail_prob > 0) {
      EngineFaultInjector* injector = faults_.get();
      scheduler_->set_allocation_fault([injector] { return injector->FailAllocation(); });
    }
  }
  max_model_len_ = options.max_model_len > 0
                       ? std::min(options.max_model_len, c.max_position_embeddings)
                       : c.max_position_embeddings;
  vocab_size_ = c.vocab_size;
  eos_ids_ = c.eos_token_ids;
  stats_.spec_accepted_at.assign(std::max(1, options.spec.num_speculative_tokens), 0);
  const uint64_t seed =
      options.seed != 0 ? options.seed : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  seed_source_.Seed(seed);
}

EngineCore::~EngineCore() {
  // Features go first: one may own threads that call wake() (KV tiers' loader) or may still use
  // the pool and backend (flushing blocks to a lower tier).
  features_.clear();
}

bool EngineCore::IsEos(int32_t token) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
}

void EngineCore::AddFeature(std::unique_ptr<EngineFeature> feature) {
  feature->Attach(this);
  features_.push_back(std::move(feature));
}

void EngineCore::AddExtensionFeatures() {
  for (auto& f : extensions_.features) AddFeature(std::move(f));
  extensions_.features.clear();
}

EngineCore::Samples* EngineCore::FindRequest(const std::string& request_id) {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : &it->second;
}

std::unique_ptr<Sequence> EngineCore::NewSequence(const std::string& request_id,
                                                  const std::optional<uint64_t>& seed) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = next_seq_id_++;
  seq->arrival_order = next_arrival_++;
  seq->request_id = request_id;
  seq->rng.Seed(seed.has_value() ? *seed : seed_source_.Next());
  return seq;
}

absl::Status EngineCore::Admit(std::unique_ptr<Sequence> seq, const EngineRequest& request) {
  scheduler_->AddWaiting(seq.get());
  for (size_t i = 0; i < features_.size(); ++i) {
    absl::Status st = features_[i]->OnAdmit(seq.get(), request);
    if (st.ok()) continue;
    SequenceUpdate discarded;
    for (size_t j = 0; j < i; ++j)
      features_[j]->OnFinish(seq.get(), FinishReason::kError, &discarded);
    scheduler_->Remove(seq.get());
    return st;
  }
  requests_[seq->request_id].push_back(std::move(seq));
  return absl::OkStatus();
}

SequenceUpdate& EngineCore::UpdateFor(Sequence* seq, std::vector<SequenceUpdate>* updates) {
  for (auto& u : *updates) {
    if (u.request_id == seq->request_id && u.index == seq->index && !u.finished) return u;
  }
  updates->emplace_back();
  updates->back().request_id = seq->request_id;
  updates->back().index = seq->index;
  return updates->back();
}

void EngineCore::BuildEdits(const Sequence& seq, LogitEdits* edits) {
  stop_ids_.assign(seq.params.stop_token_ids.begin(), seq.params.stop_token_ids.end());
  if (!seq.params.ignore_eos) stop_ids_.insert(stop_ids_.end(), eos_ids_.begin(), eos_ids_.end());
  absl::Span<const int32_t> all(seq.tokens);
  TokenHistory history{all.subspan(0, seq.prompt_len), all.subspan(seq.prompt_len)};
  BuildLogitEdits(seq.params, history, stop_ids_, static_cast<int32_t>(vocab_size_), edits);
}

void EngineCore::ProcessLogits(Sequence* seq, float* logits) {
  BuildEdits(*seq, &edits_);
  ApplyLogitEdits(edits_, logits);
  for (const auto& f : features_) f->OnLogits(seq, logits);
}

const float* EngineCore::RawLogits(const Sequence& seq, const float* row) {
  if (seq.params.logprobs < 0) return row;
  raw_logits_.assign(row, row + vocab_size_);
  return raw_logits_.data();
}

void EngineCore::SampleInto(Sequence* seq, float* logits, const float* raw_logits,
                            std::vector<SequenceUpdate>* updates) {
  ProcessLogits(seq, logits);
  // Samples 1..n-1 are forked from sample 0 once its prompt is computed; they draw their first
  // token from the same logits with their own random streams.
  const int32_t vocab = static_cast<int32_t>(vocab_size_);
  for (Sequence* child : Fork(seq)) {
    const int32_t token = SampleToken(child->params, logits, vocab, child->rng);
    AppendToken(child, token, raw_logits, &UpdateFor(child, updates));
  }
  const int32_t token = SampleToken(seq->params, logits, vocab, seq->rng);
  AppendToken(seq, token, raw_logits, &UpdateFor(seq, updates));
}

void EngineCore::AppendToken(Sequence* seq, int32_t token, const float* raw_logits,
                             SequenceUpdate* u) {
  TokenLogprobs lp;
  if (seq->params.logprobs >= 0) {
    ComputeLogprobs(raw_logits, static_cast<int32_t>(vocab_size_), token, seq->params.logprobs,
                    &lp.chosen, &lp.top);
  }
  Append(seq, token, std::move(lp), u);
}

void EngineCore::AppendDeviceSample(Sequence* seq, const DeviceSample& sample, SequenceUpdate* u) {
  TokenLogprobs lp;
  lp.chosen = sample.chosen;
  lp.top = sample.top;
  Append(seq, sample.token, std::move(lp), u);
}

void EngineCore::ResolvePendingToken(Sequence* seq, const DeviceSample& sample, SequenceUpdate* u) {
  TANDEM_CHECK(!seq->tokens.empty() && seq->tokens.back() == kPendingToken);
  seq->tokens.back() = sample.token;
  TokenLogprobs lp;
  lp.chosen = sample.chosen;
  lp.top = sample.top;
  Append(seq, sample.token, std::move(lp), u, /*placed=*/true);
}

void EngineCore::Append(Sequence* seq, int32_t token, TokenLogprobs logprobs, SequenceUpdate* u,
                        bool placed) {
  if (!placed) seq->tokens.push_back(token);
  ++stats_.generated_tokens;
  if (seq->timing.first_token == absl::InfinitePast()) seq->timing.first_token = absl::Now();
  u->new_tokens.push_back(token);
  if (seq->params.logprobs >= 0) u->logprobs.push_back(std::move(logprobs));
  FinishCheckInput in;
  in.token = token;
  in.eos = IsEos(token);
  for (const auto& f : features_) {
    f->OnToken(seq, token, in.eos, &in.verdict);
    if (!in.verdict.error.ok()) break;
  }
  const SamplingParams& p = seq->params;
  in.ignore_eos = p.ignore_eos;
  in.stop_token_ids = p.stop_token_ids;
  in.num_output = seq->num_output();
  in.max_tokens = p.max_tokens;
  in.num_tokens = seq->num_tokens();
  in.max_model_len = max_model_len_;
  FinishDecision d = CheckFinish(in);
  if (d.reason == FinishReason::kNone) return;
  if (!d.status.ok()) u->status = std::move(d.status);
  Finish(seq, d.reason, u);
}

std::vector<Sequence*> EngineCore::Fork(Sequence* parent) {
  std::vector<Sequence*> children;
  if (parent->pending_forks <= 0) return children;
  Samples& seqs = requests_[parent->request_id];
  const int32_t n = parent->pending_forks + 1;
  parent->pending_forks = 0;
  for (int32_t i = 1; i < n; ++i) {
    std::unique_ptr<Sequence> child = ForkSample(*parent, next_seq_id_++, i);
    kv_->Fork(parent->blocks, &child->blocks);
    child->rng.Seed(parent->params.seed.has_value() ? *parent->params.seed + i
                                                    : seed_source_.Next());
    Sequence* c = child.get();
    seqs.push_back(std::move(child));
    scheduler_->AddRunning(c);
    children.push_back(c);
  }
  return children;
}

void EngineCore::Finish(Sequence* seq, FinishReason reason, SequenceUpdate* u) {
  for (const auto& f : features_) f->OnFinish(seq, reason, u);
  scheduler_->Remove(seq);
  seq->status = SeqStatus::kFinished;
  seq->finish_reason = reason;
  const absl::Time now = absl::Now();
  u->finished = true;
  u->finish_reason = reason;
  u->prompt_tokens = seq->prompt_len;
  u->cached_tokens = std::max<int64_t>(0, seq->usage.cached_prompt_tokens);
  u->completion_tokens = seq->num_output();
  u->num_preemptions = seq->usage.num_preemptions;
  const SequenceTiming& t = seq->timing;
  const bool scheduled = t.first_scheduled != absl::InfinitePast();
  const bool sampled = t.first_token != absl::InfinitePast();
  u->queue_time = (scheduled ? t.first_scheduled : now) - t.arrival;
  u->prefill_time = scheduled && sampled ? t.first_token - t.first_scheduled : absl::ZeroDuration();
  u->ttft = sampled ? t.first_token - t.arrival : absl::ZeroDuration();
  u->total_time = now - t.arrival;

  auto it = requests_.find(seq->request_id);
  if (it == requests_.end()) return;
  const Samples& seqs = it->second;
  const bool all_done = std::all_of(seqs.begin(), seqs.end(), [](const auto& s) {
    return s->status == SeqStatus::kFinished && s->pending_forks == 0;
  });
  // Sequences stay alive until the end of the step (callers may still hold pointers).
  if (all_done) finished_requests_.push_back(seq->request_id);
}

void EngineCore::EndPendingForks(Sequence* seq, FinishReason reason, const absl::Status& status,
                                 std::vector<SequenceUpdate>* updates) {
  const absl::Time now = absl::Now();
  for (int32_t i = 1; i <= seq->pending_forks; ++i) {
    SequenceUpdate u;
    u.request_id = seq->request_id;
    u.index = seq->index + i;
    u.finished = true;
    u.finish_reason = reason;
    u.status = status;
    u.prompt_tokens = seq->prompt_len;
    u.queue_time = now - seq->timing.arrival;
    u.total_time = now - seq->timing.arrival;
    updates->push_back(std::move(u));
  }
  seq->pending_forks = 0;
}

void EngineCore::CountAdmission(Sequence* seq) {
  if (seq->usage.admission_counted) return;
  seq->usage.admission_counted = true;
  stats_.prompt_tokens += seq->prompt_len;
  stats_.prefix_cache_queried += seq->prompt_len;
  stats_.prefix_cache_hit += std::max<int64_t>(0, seq->usage.cached_prompt_tokens);
}

absl::Status EngineCore::CheckForeignToken(const Sequence& seq, int32_t token) const {
  for (const auto& f : features_) {
    if (absl::Status st = f->CheckForeignToken(seq, token); !st.ok()) return st;
  }
  return absl::OkStatus();
}

bool EngineCore::ForeignTokenPending(const Sequence& seq) const {
  for (const auto& f : features_) {
    if (f->ForeignTokenPending(seq)) return true;
  }
  return false;
}

void EngineCore::ReapFinished() {
  for (const std::string& id : finished_requests_) requests_.erase(id);
  finished_requests_.clear();
}

}  // namespace tandem
