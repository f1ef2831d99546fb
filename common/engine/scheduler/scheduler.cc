#include "common/engine/scheduler/scheduler.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/engine/scheduler/batch_shape_policy.h"

namespace tandem {

Scheduler::Scheduler(const SchedulerOptions& options, KvCacheManager* kv,
                     std::unique_ptr<BatchingPolicy> batching)
    : options_(options),
      kv_(kv),
      batching_(batching != nullptr ? std::move(batching)
                                    : std::make_unique<ContinuousBatching>()) {}

Scheduler::~Scheduler() = default;

void Scheduler::InsertWaiting(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                             [this](const Sequence* a, const Sequence* b) {
                               return ServedBefore(options_.policy, *a, *b);
                             });
  waiting_.insert(it, seq);
}

void Scheduler::AddWaiting(Sequence* seq) { InsertWaiting(seq); }

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  auto it = std::upper_bound(running_.begin(), running_.end(), seq,
                             [this](const Sequence* a, const Sequence* b) {
                               return ServedBefore(options_.policy, *a, *b);
                             });
  running_.insert(it, seq);
}

void Scheduler::Remove(Sequence* seq) {
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  auto r = std::find(running_.begin(), running_.end(), seq);
  const bool was_running = r != running_.end();
  if (was_running) running_.erase(r);
  auto a = std::find(awaiting_.begin(), awaiting_.end(), seq);
  if (a != awaiting_.end()) awaiting_.erase(a);
  auto p = std::find(pending_.begin(), pending_.end(), seq);
  if (p != pending_.end()) pending_.erase(p);
  if (was_running) batching_->OnLeave(seq, !running_.empty());
  kv_->Free(&seq->blocks);
  batching_->AfterRemoval(!running_.empty());
}

void Scheduler::Hold(Sequence* seq) {
  if (seq->waits++ > 0) return;
  if (seq->status == SeqStatus::kWaiting) {
    auto w = std::find(waiting_.begin(), waiting_.end(), seq);
    TANDEM_CHECK(w != waiting_.end()) << "Hold on a sequence the scheduler does not hold";
    waiting_.erase(w);
    seq->status = SeqStatus::kPending;
    pending_.push_back(seq);
    return;
  }
  auto r = std::find(running_.begin(), running_.end(), seq);
  TANDEM_CHECK(r != running_.end()) << "Hold on a sequence that is neither waiting nor running";
  running_.erase(r);
  seq->spec.ClearDraft();
  seq->status = SeqStatus::kAwaiting;
  awaiting_.push_back(seq);
}

void Scheduler::Release(Sequence* seq) {
  TANDEM_CHECK(seq->waits > 0) << "Release of a sequence that waits for nothing";
  if (--seq->waits > 0) return;
  std::vector<Sequence*>& queue = seq->status == SeqStatus::kPending ? pending_ : awaiting_;
  auto q = std::find(queue.begin(), queue.end(), seq);
  TANDEM_CHECK(q != queue.end()) << "Release of a sequence that is neither pending nor awaiting";
  queue.erase(q);
  if (seq->status == SeqStatus::kPending) {
    InsertWaiting(seq);
  } else {
    AddRunning(seq);
  }
}

void Scheduler::Preempt(Sequence* seq, SchedulerOutput* out) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  TANDEM_CHECK(r != running_.end()) << "preempting a sequence that is not running";
  running_.erase(r);
  auto s = std::find_if(out->scheduled.begin(), out->scheduled.end(),
                        [seq](const ScheduledSeq& x) { return x.seq == seq; });
  if (s != out->scheduled.end()) out->scheduled.erase(s);
  // Copies planned into its blocks are dropped: those blocks go back to the pool now.
  out->block_copies.erase(std::remove_if(out->block_copies.begin(), out->block_copies.end(),
                                         [seq](const BlockCopy& c) { return c.seq == seq; }),
                          out->block_copies.end());
  kv_->Free(&seq->blocks);
  batching_->AfterRemoval(!running_.empty());
  seq->num_computed = 0;
  seq->spec.draft.clear();
  seq->spec.draft_q.clear();
  ++seq->usage.num_preemptions;
  InsertWaiting(seq);
  out->preempted.push_back(seq);
}

bool Scheduler::Fits(int64_t needed) const {
  if (!BlocksFit(needed, kv_->pool()->num_available())) return false;
  return needed <= 0 || !fail_allocation_ || !fail_allocation_();
}

bool Scheduler::Reserve(Sequence* seq, int64_t num_new, SchedulerOutput* out) {
  const int64_t begin = seq->num_computed, end = seq->num_computed + num_new;
  while (true) {
    if (Fits(BlocksToWrite(*kv_, *kv_->pool(), seq->blocks, begin, end))) {
      TANDEM_CHECK(kv_->Grow(&seq->blocks, end));
      MakeWritable(seq, begin, end, out);
      return true;
    }
    Sequence* victim = PreemptionVictim(running_);
    Preempt(victim, out);
    if (victim == seq) return false;
  }
}

void Scheduler::AdmitWaiting(int64_t* budget, SchedulerOutput* out) {
  while (!waiting_.empty() &&
         HasSequenceSlot(num_running() + num_awaiting(), options_.max_num_seqs)) {
    Sequence* seq = waiting_.front();
    if (seq->disagg.remote_prefill) {
      // Decode role: reserve the whole prompt now (admission control on the memory-bound
      // side); the prefill worker fills the blocks past this worker's cached prefix.
      if (!ReserveRemote(seq, out)) break;
      continue;
    }
    if (!HasTokenBudget(*budget)) break;
    const bool first_admission = seq->usage.cached_prompt_tokens < 0;
    if (seq->blocks.table.empty()) {
      seq->num_computed = kv_->AcquirePrefix(seq->tokens, &seq->blocks);
      if (first_admission) {
        seq->usage.cached_prompt_tokens = std::min(seq->num_computed, seq->prompt_len);
      }
    }
    const int64_t num_new =
        ShapePrefillChunk(seq->num_uncomputed(), *budget, options_.max_prefill_chunk);
    const int64_t reserve_to = batching_->ReserveTo(*seq, seq->num_computed + num_new);
    if (!Fits(kv_->BlocksNeeded(seq->blocks, reserve_to))) {
      // Head of line waits for blocks; its cached prefix goes back to the evictable pool.
      kv_->Free(&seq->blocks);
      seq->num_computed = 0;
      if (first_admission) seq->usage.cached_prompt_tokens = -1;
      break;
    }
    TANDEM_CHECK(kv_->Grow(&seq->blocks, reserve_to));
    MakeWritable(seq, seq->num_computed, seq->num_computed + num_new, out);
    waiting_.pop_front();
    AddRunning(seq);
    out->scheduled.push_back({seq, num_new});
    *budget -= num_new;
  }
}

bool Scheduler::ReserveRemote(Sequence* seq, SchedulerOutput* out) {
  const bool first_admission = seq->usage.cached_prompt_tokens < 0;
  seq->num_computed = kv_->AcquirePrefix(seq->tokens, &seq->blocks);
  if (first_admission)
    seq->usage.cached_prompt_tokens = std::min(seq->num_computed, seq->prompt_len);
  // Window layout: local pages only for the blocks the first decode step's window sees (what
  // TrimWindow keeps once the prompt is computed); the transfer sends only those.
  const int64_t local_from = kv_->WindowFirstBlock(seq->num_tokens());
  if (!Fits(kv_->BlocksNeeded(seq->blocks, seq->num_tokens(), local_from))) {
    kv_->Free(&seq->blocks);
    seq->num_computed = 0;
    if (first_admission) seq->usage.cached_prompt_tokens = -1;
    return false;
  }
  TANDEM_CHECK(kv_->Grow(&seq->blocks, seq->num_tokens(), local_from));
  waiting_.pop_front();
  seq->status = SeqStatus::kAwaiting;
  ++seq->waits;  // released (Release) when the prompt's KV arrived
  if (seq->timing.first_scheduled == absl::InfinitePast())
    seq->timing.first_scheduled = absl::Now();
  awaiting_.push_back(seq);
  out->reserved.push_back(seq);
  return true;
}

void Scheduler::MakeWritable(Sequence* seq, int64_t begin, int64_t end, SchedulerOutput* out) {
  std::vector<std::pair<int32_t, int32_t>> copies;
  TANDEM_CHECK(kv_->MakeWritable(&seq->blocks, begin, end, &copies));
  for (const auto& [src, dst] : copies) out->block_copies.push_back({seq, src, dst});
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = options_.max_num_batched_tokens;
  const bool batch_running = !running_.empty();

  for (Sequence* seq : RowOrder(running_)) {
    if (!HasTokenBudget(budget)) break;
    if (seq->status != SeqStatus::kRunning) continue;  // preempted earlier in this step
    const int64_t num_drafts = static_cast<int64_t>(seq->spec.draft.size());
    int64_t num_new = 0;
    if (seq->is_prefill()) {
      num_new =
          ShapePrefillChunk(seq->num_uncomputed() + num_drafts, budget, options_.max_prefill_chunk);
    } else {
      const DecodeRow row = ShapeDecode(seq->num_uncomputed(), num_drafts, budget);
      if (row.num_drafts < num_drafts) {
        seq->spec.draft.resize(row.num_drafts);
        if (seq->spec.draft_q.size() > seq->spec.draft.size())
          seq->spec.draft_q.resize(seq->spec.draft.size());
      }
      num_new = row.num_new_tokens;
    }
    if (num_new <= 0) continue;
    if (!Reserve(seq, num_new, &out)) continue;
    out.scheduled.push_back({seq, num_new});
    budget -= num_new;
  }

  if (MayAdmitAfter(static_cast<int64_t>(out.preempted.size())) &&
      batching_->MayAdmit(batch_running)) {
    AdmitWaiting(&budget, &out);
  }

  for (const ScheduledSeq& s : out.scheduled) {
    out.num_batched_tokens += s.num_new_tokens;
    if (s.seq->timing.first_scheduled == absl::InfinitePast()) {
      s.seq->timing.first_scheduled = absl::Now();
    }
  }
  return out;
}

}  // namespace tandem
