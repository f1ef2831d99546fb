// Request admission and endings: validation (the engine's own checks, then each feature's),
// queueing, aborts and finishing one sample.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/engine/engine.h"
#include "common/engine/engine_core.h"

namespace tandem {

absl::Status Engine::Validate(const EngineRequest& r) const {
  const EngineCore& core = *core_;
  const EngineOptions& options = core.options();
  const int64_t vocab_size = core.vocab_size();
  const int64_t max_model_len = core.max_model_len();
  if (r.id.empty()) return absl::InvalidArgumentError("request_id: must not be empty");
  if (core.requests().count(r.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("request_id: '", r.id, "' is already running"));
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token id ", t, " outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  if (len >= max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", len,
                                                   " tokens do not fit the context length ",
                                                   max_model_len, " (one token must remain)"));
  }
  if (auto st = ValidateSamplingParams(r.params, static_cast<int32_t>(vocab_size)); !st.ok()) {
    return st;
  }
  if (len + r.params.max_tokens > max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: prompt (", len, ") + max_tokens (",
                                                   r.params.max_tokens,
                                                   ") exceeds the context length ", max_model_len));
  }
  if (!r.prior_output.empty()) {
    if (r.n != 1) return absl::InvalidArgumentError("n: must be 1 when resuming with prior output");
    for (int32_t t : r.prior_output) {
      if (t < 0 || t >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prior_output: token id ", t, " outside the vocabulary [0, ", vocab_size, ")"));
      }
    }
    if (static_cast<int64_t>(r.prior_output.size()) >= r.params.max_tokens) {
      return absl::InvalidArgumentError("prior_output: already max_tokens long");
    }
  }
  if (r.n < 1 || r.n > options.max_n) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be in [1, ", options.max_n, "], got ", r.n));
  }
  for (const auto& f : core.features()) {
    if (absl::Status st = f->Validate(r); !st.ok()) return st;
  }
  // A remote prefill reserves the prompt's blocks but only the window's local pages (fewer than
  // a chunk's), and is recomputed here in chunks if preempted: the chunked bound covers both.
  const int64_t blocks =
      core.kv().PagesFor(len + r.params.max_tokens, options.scheduler.max_num_batched_tokens);
  if (blocks > core.pool().num_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request needs ", blocks, " KV blocks (", len + r.params.max_tokens,
                     " tokens) but the pool has ", core.pool().num_blocks()));
  }
  if (core.scheduler().num_waiting() + r.n > options.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue full: ", core.scheduler().num_waiting(), " sequences waiting"));
  }
  return absl::OkStatus();
}

absl::Status Engine::AddRequest(EngineRequest r) {
  if (auto st = Validate(r); !st.ok()) return st;
  std::unique_ptr<Sequence> seq = core_->NewSequence(r.id, r.params.seed);
  seq->pending_forks = r.n - 1;
  seq->priority = r.priority;
  seq->tokens = r.prompt;
  seq->prompt_len = seq->num_tokens();
  seq->tokens.insert(seq->tokens.end(), r.prior_output.begin(), r.prior_output.end());
  seq->blocks.salt_hash = HashSalt(r.cache_salt);
  seq->params = r.params;
  // A resumed request continues its random stream where the previous worker left it: one
  // uniform per sampled token.
  if (!seq->params.greedy()) {
    for (size_t i = 0; i < r.prior_output.size(); ++i) seq->rng.Uniform();
  }
  seq->timing.arrival = r.arrival_time;
  return core_->Admit(std::move(seq), r);
}

void Engine::AbortRequest(const std::string& request_id) {
  DropInflight(request_id, -1);
  EngineCore::Samples* samples = core_->FindRequest(request_id);
  if (samples == nullptr) return;
  std::vector<SequenceUpdate>& pending = core_->pending_updates();
  std::vector<Sequence*> live;
  for (auto& s : *samples) {
    core_->EndPendingForks(s.get(), FinishReason::kAbort, absl::OkStatus(), &pending);
    if (s->status != SeqStatus::kFinished) live.push_back(s.get());
  }
  for (Sequence* s : live) {
    SequenceUpdate u;
    u.request_id = s->request_id;
    u.index = s->index;
    core_->Finish(s, FinishReason::kAbort, &u);
    pending.push_back(std::move(u));
  }
  core_->ReapFinished();
}

void Engine::FinishSequence(const std::string& request_id, int32_t index, FinishReason reason) {
  DropInflight(request_id, index);
  EngineCore::Samples* samples = core_->FindRequest(request_id);
  if (samples == nullptr) return;
  std::vector<SequenceUpdate>& pending = core_->pending_updates();
  for (auto& s : *samples) {
    if (s->index != index || s->status == SeqStatus::kFinished) continue;
    // Samples not forked yet cannot start without this one's prompt: they end (aborted) too.
    core_->EndPendingForks(s.get(), FinishReason::kAbort, absl::OkStatus(), &pending);
    SequenceUpdate u;
    u.request_id = request_id;
    u.index = index;
    core_->Finish(s.get(), reason, &u);
    pending.push_back(std::move(u));
    break;
  }
  core_->ReapFinished();
}

}  // namespace tandem
