// The engine's side of disaggregation (DESIGN §2): decode-role reservations and their leases,
// completion of a remote prefill, and prefill-role export hooks and block holds.

#include "common/engine/disagg_feature.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/lora/lora_adapter.h"

namespace tandem {

absl::Status DisaggFeature::Validate(const EngineRequest& r) const {
  if (r.remote_prefill && r.prefill_only) {
    return absl::InvalidArgumentError("a request cannot be both remote_prefill and prefill_only");
  }
  return absl::OkStatus();
}

absl::Status DisaggFeature::OnAdmit(Sequence* seq, const EngineRequest& r) {
  seq->disagg.remote_prefill = r.remote_prefill;
  seq->disagg.prefill_only = r.prefill_only;
  seq->disagg.export_hooks = r.export_hooks;
  seq->disagg.kv_lease = r.kv_lease;
  seq->disagg.kv_fence = r.kv_fence && r.remote_prefill;
  return absl::OkStatus();
}

void DisaggFeature::AfterSchedule(const SchedulerOutput& plan,
                                  std::vector<SequenceUpdate>* updates) {
  const absl::Time now = absl::Now();
  for (Sequence* seq : plan.reserved) {
    seq->disagg.lease_deadline = now + seq->disagg.kv_lease;
    KvReservation r;
    r.blocks = seq->blocks.table;
    r.cached_tokens = seq->num_computed;
    r.num_tokens = seq->num_tokens();
    r.block_size = core().kv().block_size();
    TransferWindow(r.num_tokens, &r.window_layers, &r.window_first_block);
    if (seq->lora.adapter != nullptr) r.lora_cache_key = seq->lora.adapter->cache_key;
    EngineCore::UpdateFor(seq, updates).reservation = std::move(r);
  }
}

void DisaggFeature::TransferWindow(int64_t num_tokens, std::vector<int64_t>* layers,
                                   int64_t* first_block) const {
  layers->clear();
  *first_block = 0;
  const KvCacheSpec& spec = core().backend().kv_spec();
  if (!spec.windowed() || core().kv().window().num_groups == 0) return;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (spec.layer_group[l] > 0) layers->push_back(l);
  }
  // The blocks Scheduler::ReserveRemote gives local pages (what TrimWindow keeps).
  *first_block = core().kv().WindowFirstBlock(num_tokens);
}

void DisaggFeature::OnStepBegin(std::vector<SequenceUpdate>* updates) {
  if (core().scheduler().num_awaiting() == 0) return;
  // Arrived first tokens a feature can take now (before the features' own OnStepBegin and
  // BeforeSchedule, so a grammar freed by the work that woke this step is still free).
  if (!arrived_.empty()) {
    std::vector<std::string> ready;
    for (const auto& [id, a] : arrived_) {
      if (!core().ForeignTokenPending(*core().FindRequest(id)->front())) ready.push_back(id);
    }
    for (const std::string& id : ready) {
      auto it = arrived_.find(id);
      Arrived a = std::move(it->second);
      arrived_.erase(it);
      Sequence* seq = core().FindRequest(id)->front().get();
      // Refused, the sequence waits for its KV again under its lease, as if it never came.
      if (absl::Status st = Complete(seq, a.tokens, a.logprobs, updates); !st.ok()) {
        TLOG(WARNING) << "request " << id << ": " << st;
      }
    }
  }
  const absl::Time now = absl::Now();
  std::vector<Sequence*> expired;
  for (Sequence* seq : core().scheduler().awaiting()) {
    if (seq->disagg.lease_deadline <= now && !arrived_.contains(seq->request_id)) {
      expired.push_back(seq);
    }
  }
  for (Sequence* seq : expired) {
    TLOG(WARNING) << "request " << seq->request_id << ": KV reservation lease expired after "
                  << absl::FormatDuration(seq->disagg.kv_lease) << "; freeing "
                  << seq->blocks.table.size() << " blocks";
    const absl::Status expired = absl::DeadlineExceededError(
        absl::StrCat("the prompt's KV did not arrive within the ",
                     absl::FormatDuration(seq->disagg.kv_lease), " reservation lease"));
    core().EndPendingForks(seq, FinishReason::kError, expired, updates);
    SequenceUpdate& u = EngineCore::UpdateFor(seq, updates);
    u.status = expired;
    core().Finish(seq, FinishReason::kError, &u);
  }
}

absl::Time DisaggFeature::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const Sequence* seq : core().scheduler().awaiting()) {
    if (!arrived_.contains(seq->request_id)) next = std::min(next, seq->disagg.lease_deadline);
  }
  return next;
}

absl::Status DisaggFeature::CompleteRemotePrefill(const std::string& request_id,
                                                  const std::vector<int32_t>& first_tokens,
                                                  const std::vector<TokenLogprobs>& logprobs) {
  EngineCore::Samples* samples = core().FindRequest(request_id);
  if (samples == nullptr) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not running here"));
  }
  Sequence* seq = samples->front().get();
  if (seq->status != SeqStatus::kAwaiting || !seq->disagg.remote_prefill) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " is not waiting for KV"));
  }
  const size_t n = static_cast<size_t>(seq->pending_forks) + 1;
  if (first_tokens.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request_id, ": ", first_tokens.size(), " first tokens for ", n, " samples"));
  }
  for (int32_t t : first_tokens) {
    if (t < 0 || t >= core().vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("first token ", t, " outside the vocabulary"));
    }
  }
  if (arrived_.contains(request_id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", request_id, ": its first tokens arrived already (waiting for its grammar)"));
  }
  // A feature that cannot check or take them now without waiting on the engine thread (a
  // grammar busy off the loop): they wait, the sequence stays held, the others keep stepping.
  if (core().ForeignTokenPending(*seq)) {
    arrived_[request_id] = Arrived{first_tokens, logprobs};
    return absl::OkStatus();
  }
  absl::Status st = Complete(seq, first_tokens, logprobs, &core().pending_updates());
  core().ReapFinished();
  return st;
}

absl::Status DisaggFeature::Complete(Sequence* seq, const std::vector<int32_t>& first_tokens,
                                     const std::vector<TokenLogprobs>& logprobs,
                                     std::vector<SequenceUpdate>* updates) {
  // The prefill worker sampled under the same rules (a constraint): a token outside them is
  // refused.
  for (int32_t t : first_tokens) {
    if (absl::Status st = core().CheckForeignToken(*seq, t); !st.ok()) return st;
  }
  KvCacheManager& kv = core().kv();
  seq->num_computed = seq->num_tokens();
  // From now on it is an ordinary sequence (recomputed if preempted).
  seq->disagg.remote_prefill = false;
  seq->disagg.lease_deadline = absl::InfiniteFuture();
  kv.RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
  // The reservation held only the window's local pages of the new blocks; a cached prefix may
  // still hold some before it.
  kv.TrimWindow(&seq->blocks, seq->num_computed);
  core().scheduler().Release(seq);
  std::vector<Sequence*> forked = {seq};
  for (Sequence* child : core().Fork(seq)) forked.push_back(child);
  for (size_t i = 0; i < forked.size(); ++i) {
    Sequence* s = forked[i];
    // The prefill worker drew one uniform from this sample's stream for its first token.
    if (!s->params.greedy()) s->rng.Uniform();
    SequenceUpdate& u = EngineCore::UpdateFor(s, updates);
    if (s->params.logprobs >= 0 && i < logprobs.size()) u.logprobs.push_back(logprobs[i]);
    // AppendToken computes logprobs itself only from logits; here they come from the sender.
    const int32_t saved = s->params.logprobs;
    s->params.logprobs = -1;
    core().AppendToken(s, first_tokens[i], nullptr, &u);
    s->params.logprobs = saved;
  }
  return absl::OkStatus();
}

void DisaggFeature::OnToken(Sequence* seq, int32_t /*token*/, bool /*eos*/, TokenVerdict* verdict) {
  // Prefill role: the first token is all it produces.
  if (seq->disagg.prefill_only) verdict->last_token = true;
}

void DisaggFeature::OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* u) {
  if (seq->index == 0) arrived_.erase(seq->request_id);
  if (seq->index == 0 && seq->disagg.remote_prefill && seq->disagg.kv_fence) {
    // Decode role, ended before its KV arrived: a sender may still be writing the reserved
    // blocks, so they stay out of the free list (one reference each) until the transport
    // released them (ReleaseKvFence). Never entered in the prefix cache: its KV never arrived.
    KvCacheManager& kv = core().kv();
    const uint64_t fence = ++next_fence_;
    SequenceBlocks& held = fences_[fence];
    kv.Fork(seq->blocks, &held);
    held_blocks_ += kv.PagesHeld(held);
    u->kv_fence = fence;
    return;
  }
  if (!seq->disagg.prefill_only || seq->index != 0 || reason == FinishReason::kAbort ||
      reason == FinishReason::kError) {
    return;
  }
  // Prefill role: keep the blocks (one reference each) until the export is done.
  KvCacheManager& kv = core().kv();
  SequenceBlocks& hold = holds_[seq->request_id];
  if (!hold.table.empty()) {  // a repeated id: its older hold is superseded
    held_blocks_ -= kv.PagesHeld(hold);
    kv.Free(&hold);
  }
  kv.Fork(seq->blocks, &hold);
  u->held_blocks = seq->blocks.table;
  held_blocks_ += kv.PagesHeld(hold);
}

void DisaggFeature::ReleaseHold(const std::string& request_id) {
  auto it = holds_.find(request_id);
  if (it == holds_.end()) return;
  held_blocks_ -= core().kv().PagesHeld(it->second);
  core().kv().Free(&it->second);
  holds_.erase(it);
}

void DisaggFeature::ReleaseKvFence(uint64_t fence) {
  auto it = fences_.find(fence);
  if (it == fences_.end()) return;
  held_blocks_ -= core().kv().PagesHeld(it->second);
  core().kv().Free(&it->second);
  fences_.erase(it);
}

void DisaggFeature::AddStats(EngineStats* stats) const { stats->kv_blocks_held = held_blocks_; }

void DisaggFeature::BeforeForward(const SchedulerOutput& plan,
                                  const std::vector<Sequence*>& /*sampled*/, ForwardBatch* batch) {
  std::vector<Sequence*> exporting;
  for (const ScheduledSeq& s : plan.scheduled) {
    Sequence* seq = s.seq;
    if (seq->disagg.export_hooks && seq->disagg.export_hooks->on_layer &&
        seq->num_computed + s.num_new_tokens == seq->num_tokens()) {
      exporting.push_back(seq);
    }
  }
  if (exporting.empty()) return;
  std::function<void(int64_t)> earlier = std::move(batch->on_layer_done);
  batch->on_layer_done = [exporting, earlier](int64_t layer) {
    if (earlier) earlier(layer);
    for (Sequence* seq : exporting) seq->disagg.export_hooks->on_layer(seq->blocks.table, layer);
  };
}

}  // namespace tandem
