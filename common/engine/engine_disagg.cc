// The engine's side of disaggregation (DESIGN §2): decode-role reservations and their leases,
// completion of a remote prefill, and prefill-role export hooks and block holds.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/engine.h"

namespace tandem {

void Engine::ReportReservations(const SchedulerOutput& plan, std::vector<SequenceUpdate>* updates) {
  const absl::Time now = absl::Now();
  for (Sequence* seq : plan.reserved) {
    CountAdmission(seq);
    seq->disagg.lease_deadline = now + seq->disagg.kv_lease;
    KvReservation r;
    r.blocks = seq->blocks.table;
    r.cached_tokens = seq->num_computed;
    r.num_tokens = seq->num_tokens();
    r.block_size = kv_->block_size();
    TransferWindow window = RemoteTransferWindow(r.num_tokens);
    r.window_layers = std::move(window.layers);
    r.window_first_block = window.first_block;
    UpdateFor(seq, updates).reservation = std::move(r);
  }
}

Engine::TransferWindow Engine::RemoteTransferWindow(int64_t num_tokens) const {
  TransferWindow w;
  const KvCacheSpec& spec = backend_->kv_spec();
  if (!spec.windowed() || kv_->window().num_groups == 0) return w;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (spec.layer_group[l] > 0) w.layers.push_back(l);
  }
  // The blocks Scheduler::ReserveRemote gives local pages (what TrimWindow keeps).
  w.first_block = kv_->WindowFirstBlock(num_tokens);
  return w;
}

void Engine::ExpireLeases(std::vector<SequenceUpdate>* updates) {
  if (scheduler_->num_awaiting() == 0) return;
  const absl::Time now = absl::Now();
  std::vector<Sequence*> expired;
  for (Sequence* seq : scheduler_->awaiting()) {
    if (seq->disagg.lease_deadline <= now) expired.push_back(seq);
  }
  for (Sequence* seq : expired) {
    TLOG(WARNING) << "request " << seq->request_id << ": KV reservation lease expired after "
                  << absl::FormatDuration(seq->disagg.kv_lease) << "; freeing "
                  << seq->blocks.table.size() << " blocks";
    const absl::Status expired = absl::DeadlineExceededError(
        absl::StrCat("the prompt's KV did not arrive within the ",
                     absl::FormatDuration(seq->disagg.kv_lease), " reservation lease"));
    EndPendingForks(seq, FinishReason::kError, expired, updates);
    SequenceUpdate& u = UpdateFor(seq, updates);
    u.status = expired;
    Finish(seq, FinishReason::kError, &u);
  }
}

absl::Time Engine::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const Sequence* seq : scheduler_->awaiting())
    next = std::min(next, seq->disagg.lease_deadline);
  return next;
}

absl::Status Engine::CompleteRemotePrefill(const std::string& request_id,
                                           const std::vector<int32_t>& first_tokens,
                                           const std::vector<TokenLogprobs>& logprobs) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not running here"));
  }
  Sequence* seq = it->second.front().get();
  if (seq->status != SeqStatus::kAwaitingKv) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " is not waiting for KV"));
  }
  const size_t n = static_cast<size_t>(seq->pending_forks) + 1;
  if (first_tokens.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request_id, ": ", first_tokens.size(), " first tokens for ", n, " samples"));
  }
  for (int32_t t : first_tokens) {
    if (t < 0 || t >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("first token ", t, " outside the vocabulary"));
    }
  }
  if (seq->grammar.active()) {
    // The prefill worker sampled under the same constraint; a token outside it is refused.
    for (int32_t t : first_tokens) {
      grammar::GrammarMatcher probe(*seq->grammar.matcher);
      if (std::find(eos_ids_.begin(), eos_ids_.end(), t) == eos_ids_.end() &&
          !probe.AcceptToken(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("first token ", t, " does not follow the request's constraint"));
      }
    }
  }
  seq->num_computed = seq->num_tokens();
  seq->disagg.remote_prefill =
      false;  // from now on it is an ordinary sequence (recomputed if preempted)
  seq->disagg.lease_deadline = absl::InfiniteFuture();
  kv_->RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
  // The reservation held only the window's local pages of the new blocks; a cached prefix may
  // still hold some before it.
  kv_->TrimWindow(&seq->blocks, seq->num_computed);
  scheduler_->StartAwaited(seq);
  std::vector<Sequence*> samples = {seq};
  for (Sequence* child : Fork(seq)) samples.push_back(child);
  for (size_t i = 0; i < samples.size(); ++i) {
    Sequence* s = samples[i];
    // The prefill worker drew one uniform from this sample's stream for its first token.
    if (!s->params.greedy()) s->rng.Uniform();
    SequenceUpdate& u = UpdateFor(s, &pending_updates_);
    if (s->params.logprobs >= 0 && i < logprobs.size()) u.logprobs.push_back(logprobs[i]);
    // AppendToken computes logprobs itself only from logits; here they come from the sender.
    const int32_t saved = s->params.logprobs;
    s->params.logprobs = -1;
    AppendToken(s, first_tokens[i], nullptr, &u);
    s->params.logprobs = saved;
  }
  ReapFinished();
  return absl::OkStatus();
}

void Engine::ReleaseHold(const std::string& request_id) {
  auto it = holds_.find(request_id);
  if (it == holds_.end()) return;
  held_blocks_ -= kv_->PagesHeld(it->second);
  kv_->Free(&it->second);
  holds_.erase(it);
}

std::function<void(int64_t)> Engine::ExportHook(const SchedulerOutput& plan) {
  std::vector<Sequence*> exporting;
  for (const ScheduledSeq& s : plan.scheduled) {
    Sequence* seq = s.seq;
    if (seq->disagg.export_hooks && seq->disagg.export_hooks->on_layer &&
        seq->num_computed + s.num_new_tokens == seq->num_tokens()) {
      exporting.push_back(seq);
    }
  }
  if (exporting.empty()) return nullptr;
  return [exporting](int64_t layer) {
    for (Sequence* seq : exporting) seq->disagg.export_hooks->on_layer(seq->blocks.table, layer);
  };
}

}  // namespace tandem
