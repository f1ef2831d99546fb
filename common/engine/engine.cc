#include "common/engine/engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/finish_check.h"

namespace tandem {

Engine::Engine(const EngineOptions& options, std::shared_ptr<const Model> model,
               std::unique_ptr<Backend> backend)
    : options_(options), model_(std::move(model)), backend_(std::move(backend)) {}

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
  std::unique_ptr<Engine> e(new Engine(options, std::move(model), std::move(backend)));
  e->proposer_ = std::move(proposer);
  const ModelConfig& c = e->model_->config();
  const KvCacheSpec& spec = e->backend_->kv_spec();
  e->pool_ = std::make_unique<BlockPool>(spec.num_blocks, options.enable_prefix_cache);
  KvWindow window;
  if (spec.windowed()) window = {spec.sliding_window, spec.num_local_groups()};
  Backend* backend_ptr = e->backend_.get();
  e->kv_ =
      std::make_unique<KvCacheManager>(e->pool_.get(), spec.block_size, window,
                                       [backend_ptr](int32_t block, int64_t group, int32_t page) {
                                         backend_ptr->MapLocalPage(block, group, page);
                                       });
  e->scheduler_ = std::make_unique<Scheduler>(options.scheduler, e->kv_.get());
  const EngineFaultOptions faults =
      ResolveEngineFaultOptions(options.faults, options.faults_from_env);
  if (faults.enabled()) {
    e->faults_ = std::make_unique<EngineFaultInjector>(faults);
    if (faults.alloc_fail_prob > 0) {
      EngineFaultInjector* injector = e->faults_.get();
      e->scheduler_->set_allocation_fault([injector] { return injector->FailAllocation(); });
    }
  }
  e->max_model_len_ = options.max_model_len > 0
                          ? std::min(options.max_model_len, c.max_position_embeddings)
                          : c.max_position_embeddings;
  e->vocab_size_ = c.vocab_size;
  e->eos_ids_ = c.eos_token_ids;
  e->stats_.spec_accepted_at.assign(std::max(1, options.spec.num_speculative_tokens), 0);
  uint64_t seed =
      options.seed != 0 ? options.seed : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  e->seed_source_.Seed(seed);
  return e;
}

SequenceUpdate& Engine::UpdateFor(Sequence* seq, std::vector<SequenceUpdate>* updates) {
  for (auto& u : *updates) {
    if (u.request_id == seq->request_id && u.index == seq->index && !u.finished) return u;
  }
  updates->emplace_back();
  updates->back().request_id = seq->request_id;
  updates->back().index = seq->index;
  return updates->back();
}

void Engine::AppendToken(Sequence* seq, int32_t token, const float* raw_logits, SequenceUpdate* u) {
  seq->tokens.push_back(token);
  ++stats_.generated_tokens;
  if (seq->timing.first_token == absl::InfinitePast()) seq->timing.first_token = absl::Now();
  u->new_tokens.push_back(token);
  if (seq->params.logprobs >= 0) {
    TokenLogprobs lp;
    ComputeLogprobs(raw_logits, static_cast<int32_t>(vocab_size_), token, seq->params.logprobs,
                    &lp.chosen, &lp.top);
    u->logprobs.push_back(std::move(lp));
  }
  const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  TokenVerdict verdict;
  if (seq->grammar.active()) {
    verdict.constrained = true;
    if (!seq->grammar.matcher->status().ok()) {
      // The grammar's state graph reached its bound: the mask was incomplete.
      verdict.error = seq->grammar.matcher->status();
    } else if (!eos) {
      if (!seq->grammar.matcher->AcceptToken(token)) {
        // Masks make this unreachable; refuse to continue outside the grammar.
        verdict.error = absl::InternalError(absl::StrCat("token ", token, " outside the grammar"));
      } else {
        verdict.complete = seq->grammar.matcher->IsTerminated();
      }
    }
  }
  verdict.last_token = seq->disagg.prefill_only;
  const SamplingParams& p = seq->params;
  FinishCheckInput in;
  in.token = token;
  in.eos = eos;
  in.ignore_eos = p.ignore_eos;
  in.stop_token_ids = p.stop_token_ids;
  in.num_output = seq->num_output();
  in.max_tokens = p.max_tokens;
  in.num_tokens = seq->num_tokens();
  in.max_model_len = max_model_len_;
  in.verdict = std::move(verdict);
  FinishDecision d = CheckFinish(in);
  if (d.reason == FinishReason::kNone) return;
  if (!d.status.ok()) u->status = std::move(d.status);
  Finish(seq, d.reason, u);
}

void Engine::SampleInto(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates,
                        const float* raw_logits) {
  std::vector<int32_t> stop_ids = seq->params.stop_token_ids;
  if (!seq->params.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
  absl::Span<const int32_t> all(seq->tokens);
  TokenHistory history{all.subspan(0, seq->prompt_len), all.subspan(seq->prompt_len)};
  ProcessLogits(seq->params, history, stop_ids, logits, static_cast<int32_t>(vocab_size_));
  ApplyGrammarMask(seq, logits);
  // Samples 1..n-1 are forked from sample 0 once its prompt is computed; they draw their first
  // token from the same logits with their own random streams.
  for (Sequence* child : Fork(seq)) {
    int32_t token =
        SampleToken(child->params, logits, static_cast<int32_t>(vocab_size_), child->rng);
    AppendToken(child, token, raw_logits, &UpdateFor(child, updates));
  }
  int32_t token = SampleToken(seq->params, logits, static_cast<int32_t>(vocab_size_), seq->rng);
  AppendToken(seq, token, raw_logits, &UpdateFor(seq, updates));
}

std::vector<Sequence*> Engine::Fork(Sequence* parent) {
  std::vector<Sequence*> children;
  if (parent->pending_forks <= 0) return children;
  auto& seqs = requests_[parent->request_id];
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

void Engine::FailStep(const absl::Status& status, const SchedulerOutput& plan,
                      std::vector<SequenceUpdate>* updates) {
  TLOG(ERROR) << "forward pass failed, failing " << plan.scheduled.size()
              << " sequences: " << status;
  for (const ScheduledSeq& s : plan.scheduled) {
    if (s.seq->status == SeqStatus::kFinished) continue;
    EndPendingForks(s.seq, FinishReason::kError, status, updates);
    SequenceUpdate& u = UpdateFor(s.seq, updates);
    u.status = status;
    Finish(s.seq, FinishReason::kError, &u);
  }
}

std::vector<SequenceUpdate> Engine::Step() {
  std::vector<SequenceUpdate> updates = std::move(pending_updates_);
  pending_updates_.clear();
  ExpireLeases(&updates);
  if (scheduler_->idle()) {
    ReapFinished();
    return updates;
  }

  if (faults_ != nullptr) {
    const absl::Duration stall = faults_->NextStall();
    if (stall > absl::ZeroDuration()) absl::SleepFor(stall);
  }
  ProposeDrafts();
  SchedulerOutput plan = scheduler_->Schedule();
  ++stats_.steps;
  stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
  ReportReservations(plan, &updates);
  if (plan.scheduled.empty()) {
    ReapFinished();
    return updates;
  }

  for (const BlockCopy& c : plan.block_copies) backend_->CopyBlock(c.src, c.dst);

  const int64_t block_size = backend_->kv_spec().block_size;
  ForwardBatch batch;
  std::vector<Sequence*> sampled;
  for (const ScheduledSeq& s : plan.scheduled) {
    Sequence* seq = s.seq;
    CountAdmission(seq);
    // A speculating decode feeds its last token and the drafted ones, with logits at each.
    const int64_t real = s.num_new_tokens - static_cast<int64_t>(seq->spec.draft.size());
    const bool completes = seq->num_computed + real == seq->num_tokens();
    std::vector<int32_t> chunk(seq->tokens.begin() + seq->num_computed,
                               seq->tokens.begin() + seq->num_computed + real);
    chunk.insert(chunk.end(), seq->spec.draft.begin(), seq->spec.draft.end());
    batch.AddSequenceRows(chunk, static_cast<int32_t>(seq->num_computed), seq->blocks.table,
                          block_size,
                          completes ? 1 + static_cast<int64_t>(seq->spec.draft.size()) : 0);
    batch.seqs.back().local_tables = seq->blocks.local;
    if (completes) sampled.push_back(seq);
  }
  // Static (fixed-shape) baseline: finished members are still computed, their logits discarded.
  for (const PaddingRow& p : scheduler_->padding()) {
    batch.AddSequenceRows({p.token}, p.pos, p.blocks.table, block_size, 1);
    batch.seqs.back().local_tables = p.blocks.local;
  }
  stats_.padding_rows += static_cast<int64_t>(scheduler_->padding().size());

  batch.on_layer_done = ExportHook(plan);
  const size_t vocab = static_cast<size_t>(vocab_size_);
  logits_.resize(batch.logit_rows.size() * vocab);
  // Grammar masks for this step's samples are computed while the forward pass runs.
  std::function<void()> join_masks = StartGrammarMasks(sampled);
  absl::Status st = backend_->Forward(batch, logits_.data());
  join_masks();
  if (!st.ok()) {
    FailStep(st, plan, &updates);
    return updates;
  }

  for (const ScheduledSeq& s : plan.scheduled) {
    if (!s.seq->spec.draft.empty()) continue;  // advanced by verification below
    s.seq->num_computed += s.num_new_tokens;
    kv_->RegisterFull(s.seq->tokens, s.seq->num_computed, &s.seq->blocks);
  }
  size_t row_index = 0;
  for (Sequence* seq : sampled) {
    float* row = logits_.data() + row_index * vocab;
    if (!seq->spec.draft.empty()) {
      row_index += 1 + seq->spec.draft.size();
      VerifyDrafts(seq, row, &updates);
      continue;
    }
    ++row_index;
    const float* raw = row;
    if (seq->params.logprobs >= 0) {
      raw_logits_.assign(row, row + vocab);
      raw = raw_logits_.data();
    }
    SampleInto(seq, row, &updates, raw);
  }
  // Window layout: local pages the next queries cannot see go back to the pool (after
  // verification, so that rolled-back positions never widen the window again).
  for (const ScheduledSeq& s : plan.scheduled) {
    if (s.seq->status == SeqStatus::kRunning) kv_->TrimWindow(&s.seq->blocks, s.seq->num_computed);
  }
  ReapFinished();
  return updates;
}

bool Engine::HasWork() const { return !scheduler_->idle() || !pending_updates_.empty(); }

void Engine::CountAdmission(Sequence* seq) {
  if (seq->usage.admission_counted) return;
  seq->usage.admission_counted = true;
  stats_.prompt_tokens += seq->prompt_len;
  stats_.prefix_cache_queried += seq->prompt_len;
  stats_.prefix_cache_hit += std::max<int64_t>(0, seq->usage.cached_prompt_tokens);
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.num_awaiting_kv = scheduler_->num_awaiting();
  s.kv_blocks_held = held_blocks_;
  s.kv_blocks_total = pool_->num_blocks();
  s.kv_blocks_used = pool_->num_referenced();
  s.kv_blocks_cached = pool_->num_cached();
  s.kv_blocks_evictable = pool_->num_evictable();
  s.kv_evictions = pool_->num_evictions();
  s.spec_draft_blocks = proposer_ ? proposer_->blocks_in_use() : 0;
  const int64_t block_size = kv_->block_size();
  for (const auto& [id, seqs] : requests_) {
    for (const auto& seq : seqs) {
      if (seq->status != SeqStatus::kRunning) continue;
      s.kv_reserved_token_slots += static_cast<int64_t>(seq->blocks.table.size()) * block_size;
      s.kv_filled_token_slots += seq->num_computed;
    }
  }
  for (const PaddingRow& p : scheduler_->padding()) {
    s.kv_reserved_token_slots += static_cast<int64_t>(p.blocks.table.size()) * block_size;
    s.kv_filled_token_slots += p.pos + 1;
  }
  return s;
}

}  // namespace tandem
