#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/engine.h"

// Request admission and endings: validation, queueing, aborts and Finish.

namespace tandem {

absl::Status Engine::Validate(const EngineRequest& r) const {
  if (r.id.empty()) return absl::InvalidArgumentError("request_id: must not be empty");
  if (requests_.count(r.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("request_id: '", r.id, "' is already running"));
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token id ", t, " outside the vocabulary [0, ", vocab_size_, ")"));
    }
  }
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  if (len >= max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", len,
                                                   " tokens do not fit the context length ",
                                                   max_model_len_, " (one token must remain)"));
  }
  if (auto st = ValidateSamplingParams(r.params, static_cast<int32_t>(vocab_size_)); !st.ok()) {
    return st;
  }
  if (len + r.params.max_tokens > max_model_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: prompt (", len, ") + max_tokens (", r.params.max_tokens,
                     ") exceeds the context length ", max_model_len_));
  }
  if (!r.prior_output.empty()) {
    if (r.n != 1) return absl::InvalidArgumentError("n: must be 1 when resuming with prior output");
    for (int32_t t : r.prior_output) {
      if (t < 0 || t >= vocab_size_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prior_output: token id ", t, " outside the vocabulary [0, ", vocab_size_, ")"));
      }
    }
    if (static_cast<int64_t>(r.prior_output.size()) >= r.params.max_tokens) {
      return absl::InvalidArgumentError("prior_output: already max_tokens long");
    }
  }
  if (r.remote_prefill && r.prefill_only) {
    return absl::InvalidArgumentError("a request cannot be both remote_prefill and prefill_only");
  }
  if (r.n < 1 || r.n > options_.max_n) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be in [1, ", options_.max_n, "], got ", r.n));
  }
  // A remote prefill reserves the prompt's blocks but only the window's local pages (fewer than
  // a chunk's), and is recomputed here in chunks if preempted: the chunked bound covers both.
  const int64_t blocks =
      kv_->PagesFor(len + r.params.max_tokens, options_.scheduler.max_num_batched_tokens);
  if (blocks > pool_->num_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request needs ", blocks, " KV blocks (", len + r.params.max_tokens,
                     " tokens) but the pool has ", pool_->num_blocks()));
  }
  if (scheduler_->num_waiting() + r.n > options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue full: ", scheduler_->num_waiting(), " sequences waiting"));
  }
  return absl::OkStatus();
}

absl::Status Engine::AddRequest(EngineRequest r) {
  if (auto st = Validate(r); !st.ok()) return st;
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = next_seq_id_++;
  seq->arrival_order = next_arrival_++;
  seq->request_id = r.id;
  seq->index = 0;
  seq->pending_forks = r.n - 1;
  seq->priority = r.priority;
  seq->tokens = std::move(r.prompt);
  seq->prompt_len = seq->num_tokens();
  seq->tokens.insert(seq->tokens.end(), r.prior_output.begin(), r.prior_output.end());
  seq->disagg.remote_prefill = r.remote_prefill;
  seq->disagg.prefill_only = r.prefill_only;
  seq->disagg.export_hooks = std::move(r.export_hooks);
  seq->spec.k = options_.spec.num_speculative_tokens;
  seq->disagg.kv_lease = r.kv_lease;
  seq->blocks.salt_hash = HashSalt(r.cache_salt);
  seq->params = std::move(r.params);
  seq->rng.Seed(seq->params.seed.has_value() ? *seq->params.seed : seed_source_.Next());
  // A resumed request continues its random stream where the previous worker left it: one
  // uniform per sampled token.
  if (!seq->params.greedy()) {
    for (size_t i = 0; i < r.prior_output.size(); ++i) seq->rng.Uniform();
  }
  seq->timing.arrival = r.arrival_time;
  if (auto st = AttachGrammar(seq.get(), r.prior_output); !st.ok()) return st;
  scheduler_->AddWaiting(seq.get());
  requests_[seq->request_id].push_back(std::move(seq));
  return absl::OkStatus();
}

void Engine::Finish(Sequence* seq, FinishReason reason, SequenceUpdate* u) {
  if (seq->disagg.prefill_only && seq->index == 0 && reason != FinishReason::kAbort &&
      reason != FinishReason::kError) {
    // Prefill role: keep the blocks (one reference each) until the export is done.
    SequenceBlocks& hold = holds_[seq->request_id];
    if (!hold.table.empty()) {  // a repeated id: its older hold is superseded
      held_blocks_ -= kv_->PagesHeld(hold);
      kv_->Free(&hold);
    }
    kv_->Fork(seq->blocks, &hold);
    u->held_blocks = seq->blocks.table;
    held_blocks_ += kv_->PagesHeld(hold);
  }
  scheduler_->Remove(seq);
  seq->status = SeqStatus::kFinished;
  seq->finish_reason = reason;
  const absl::Time now = absl::Now();
  u->finished = true;
  u->finish_reason = reason;
  u->prompt_tokens = seq->prompt_len;
  u->cached_tokens = std::max<int64_t>(0, seq->usage.cached_prompt_tokens);
  u->completion_tokens = seq->num_output();
  u->usage.num_preemptions = seq->usage.num_preemptions;
  u->spec_accepted_tokens = seq->spec.accepted;
  seq->spec.draft.clear();
  seq->spec.draft_q.clear();
  if (proposer_ != nullptr) proposer_->Release(seq->seq_id);
  const bool scheduled = seq->timing.first_scheduled != absl::InfinitePast();
  const bool sampled = seq->timing.first_token != absl::InfinitePast();
  u->queue_time = (scheduled ? seq->timing.first_scheduled : now) - seq->timing.arrival;
  u->prefill_time = scheduled && sampled ? seq->timing.first_token - seq->timing.first_scheduled
                                         : absl::ZeroDuration();
  u->ttft = sampled ? seq->timing.first_token - seq->timing.arrival : absl::ZeroDuration();
  u->total_time = now - seq->timing.arrival;

  auto it = requests_.find(seq->request_id);
  if (it == requests_.end()) return;
  auto& seqs = it->second;
  bool all_done = std::all_of(seqs.begin(), seqs.end(), [](const auto& s) {
    return s->status == SeqStatus::kFinished && s->pending_forks == 0;
  });
  // Sequences stay alive until the end of the step (callers may still hold pointers).
  if (all_done) finished_requests_.push_back(seq->request_id);
}

void Engine::EndPendingForks(Sequence* seq, FinishReason reason, const absl::Status& status,
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

void Engine::AbortRequest(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  std::vector<Sequence*> live;
  for (auto& s : it->second) {
    EndPendingForks(s.get(), FinishReason::kAbort, absl::OkStatus(), &pending_updates_);
    if (s->status != SeqStatus::kFinished) live.push_back(s.get());
  }
  for (Sequence* s : live) {
    SequenceUpdate u;
    u.request_id = s->request_id;
    u.index = s->index;
    Finish(s, FinishReason::kAbort, &u);
    pending_updates_.push_back(std::move(u));
  }
  ReapFinished();
}

void Engine::ReapFinished() {
  for (const std::string& id : finished_requests_) requests_.erase(id);
  finished_requests_.clear();
}

void Engine::FinishSequence(const std::string& request_id, int32_t index, FinishReason reason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  for (auto& s : it->second) {
    if (s->index != index || s->status == SeqStatus::kFinished) continue;
    // Samples not forked yet cannot start without this one's prompt: they end (aborted) too.
    EndPendingForks(s.get(), FinishReason::kAbort, absl::OkStatus(), &pending_updates_);
    SequenceUpdate u;
    u.request_id = request_id;
    u.index = index;
    Finish(s.get(), reason, &u);
    pending_updates_.push_back(std::move(u));
    break;
  }
  ReapFinished();
}

}  // namespace tandem
