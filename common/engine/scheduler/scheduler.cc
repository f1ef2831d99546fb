#include "common/engine/scheduler/scheduler.h"

#include <algorithm>

#include "common/base/log.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerOptions& options, KvCacheManager* kv)
    : options_(options), kv_(kv) {}

bool Scheduler::Before(const Sequence* a, const Sequence* b) const {
  if (options_.policy == SchedulingPolicy::kPriority && a->priority != b->priority) {
    return a->priority < b->priority;
  }
  if (a->arrival_order != b->arrival_order) return a->arrival_order < b->arrival_order;
  return a->index < b->index;
}

void Scheduler::InsertWaiting(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                             [this](const Sequence* a, const Sequence* b) { return Before(a, b); });
  waiting_.insert(it, seq);
}

void Scheduler::AddWaiting(Sequence* seq) { InsertWaiting(seq); }

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  auto it = std::upper_bound(running_.begin(), running_.end(), seq,
                             [this](const Sequence* a, const Sequence* b) { return Before(a, b); });
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
  if (!(was_running && KeepAsPadding(seq))) kv_->Free(&seq->blocks);
  ReleasePaddingIfBatchDone();
}

bool Scheduler::is_static() const {
  return options_.policy == SchedulingPolicy::kStatic ||
         options_.policy == SchedulingPolicy::kStaticCompact;
}

bool Scheduler::KeepAsPadding(Sequence* seq) {
  if (options_.policy != SchedulingPolicy::kStatic || running_.empty() || seq->tokens.empty()) {
    return false;
  }
  const int64_t pos = std::min(seq->num_computed, seq->num_tokens() - 1);
  const int64_t block = pos / kv_->block_size();
  // The row writes its slot: only into a block of its own (a forked sibling may share others).
  if (block >= static_cast<int64_t>(seq->blocks.table.size()) ||
      kv_->pool()->refcount(seq->blocks.table[block]) != 1) {
    return false;
  }
  PaddingRow row;
  row.token = seq->tokens[pos];
  row.pos = static_cast<int32_t>(pos);
  row.blocks = std::move(seq->blocks);
  seq->blocks = SequenceBlocks{};
  padding_.push_back(std::move(row));
  return true;
}

void Scheduler::ReleasePaddingIfBatchDone() {
  if (!running_.empty()) return;
  for (PaddingRow& row : padding_) kv_->Free(&row.blocks);
  padding_.clear();
}

void Scheduler::StartAwaited(Sequence* seq) {
  auto a = std::find(awaiting_.begin(), awaiting_.end(), seq);
  TANDEM_CHECK(a != awaiting_.end()) << "StartAwaited on a sequence that is not awaiting KV";
  awaiting_.erase(a);
  AddRunning(seq);
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
  ReleasePaddingIfBatchDone();
  seq->num_computed = 0;
  seq->draft.clear();
  seq->draft_q.clear();
  ++seq->num_preemptions;
  InsertWaiting(seq);
  out->preempted.push_back(seq);
}

bool Scheduler::Fits(int64_t needed) const {
  if (needed > kv_->pool()->num_available()) return false;
  return needed <= 0 || !fail_allocation_ || !fail_allocation_();
}

bool Scheduler::Reserve(Sequence* seq, int64_t num_new, SchedulerOutput* out) {
  const int64_t begin = seq->num_computed, end = seq->num_computed + num_new;
  while (true) {
    int64_t needed = kv_->BlocksNeeded(seq->blocks, end);
    const int64_t first = begin / kv_->block_size();
    const int64_t last = std::min<int64_t>((end - 1) / kv_->block_size(),
                                           static_cast<int64_t>(seq->blocks.table.size()) - 1);
    for (int64_t i = first; i <= last; ++i) {
      needed += kv_->pool()->refcount(seq->blocks.table[i]) > 1;
    }
    if (Fits(needed)) {
      TANDEM_CHECK(kv_->Grow(&seq->blocks, end));
      MakeWritable(seq, begin, end, out);
      return true;
    }
    Sequence* victim = running_.back();  // running_ is in service order: the last is served last
    Preempt(victim, out);
    if (victim == seq) return false;
  }
}

bool Scheduler::AdmitWaiting(int64_t* budget, SchedulerOutput* out) {
  bool admitted = false;
  while (!waiting_.empty() &&
         static_cast<int64_t>(running_.size() + awaiting_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (seq->remote_prefill) {
      // Decode role: reserve the whole prompt now (admission control on the memory-bound
      // side); the prefill worker fills the blocks past this worker's cached prefix.
      if (!ReserveRemote(seq, out)) break;
      continue;
    }
    if (*budget <= 0) break;
    bool first_admission = seq->cached_prompt_tokens < 0;
    if (seq->blocks.table.empty()) {
      seq->num_computed = kv_->AcquirePrefix(seq->tokens, &seq->blocks);
      if (first_admission) {
        seq->cached_prompt_tokens = std::min(seq->num_computed, seq->prompt_len);
      }
    }
    int64_t num_new = std::min(seq->num_uncomputed(), *budget);
    if (options_.max_prefill_chunk > 0) num_new = std::min(num_new, options_.max_prefill_chunk);
    const int64_t reserve_to =
        is_static() ? seq->prompt_len + seq->params.max_tokens : seq->num_computed + num_new;
    if (!Fits(kv_->BlocksNeeded(seq->blocks, reserve_to))) {
      // Head of line waits for blocks; its cached prefix goes back to the evictable pool.
      kv_->Free(&seq->blocks);
      seq->num_computed = 0;
      if (first_admission) seq->cached_prompt_tokens = -1;
      break;
    }
    TANDEM_CHECK(kv_->Grow(&seq->blocks, reserve_to));
    MakeWritable(seq, seq->num_computed, seq->num_computed + num_new, out);
    waiting_.pop_front();
    AddRunning(seq);
    out->scheduled.push_back({seq, num_new});
    *budget -= num_new;
    admitted = true;
  }
  return admitted;
}

bool Scheduler::ReserveRemote(Sequence* seq, SchedulerOutput* out) {
  const bool first_admission = seq->cached_prompt_tokens < 0;
  seq->num_computed = kv_->AcquirePrefix(seq->tokens, &seq->blocks);
  if (first_admission) seq->cached_prompt_tokens = std::min(seq->num_computed, seq->prompt_len);
  if (!Fits(kv_->BlocksNeeded(seq->blocks, seq->num_tokens()))) {
    kv_->Free(&seq->blocks);
    seq->num_computed = 0;
    if (first_admission) seq->cached_prompt_tokens = -1;
    return false;
  }
  TANDEM_CHECK(kv_->Grow(&seq->blocks, seq->num_tokens()));
  waiting_.pop_front();
  seq->status = SeqStatus::kAwaitingKv;
  if (seq->first_scheduled_time == absl::InfinitePast()) seq->first_scheduled_time = absl::Now();
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
  const bool batch_done = running_.empty();

  // Running sequences: decodes first (one token each, cheap and latency-critical), then
  // prefill chunks.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<Sequence*> order = running_;
    for (Sequence* seq : order) {
      if (budget <= 0) break;
      if (seq->status != SeqStatus::kRunning) continue;  // preempted earlier in this step
      if (seq->is_prefill() != (pass == 1)) continue;
      if (std::any_of(out.scheduled.begin(), out.scheduled.end(),
                      [seq](const ScheduledSeq& s) { return s.seq == seq; })) {
        continue;
      }
      // A decode with a speculative proposal verifies 1 + k tokens; drafts that do not fit the
      // budget are dropped.
      int64_t num_new = std::min<int64_t>(
          seq->num_uncomputed() + static_cast<int64_t>(seq->draft.size()), budget);
      if (pass == 0 && num_new - 1 < static_cast<int64_t>(seq->draft.size())) {
        seq->draft.resize(std::max<int64_t>(0, num_new - 1));
        if (seq->draft_q.size() > seq->draft.size()) seq->draft_q.resize(seq->draft.size());
      }
      if (pass == 1 && options_.max_prefill_chunk > 0) {
        num_new = std::min(num_new, options_.max_prefill_chunk);
      }
      if (num_new <= 0) continue;
      if (!Reserve(seq, num_new, &out)) continue;
      out.scheduled.push_back({seq, num_new});
      budget -= num_new;
    }
  }

  // Newcomers join only when nothing had to be preempted (there is no room to spare), and under
  // the static baseline only when the previous batch has finished.
  if (out.preempted.empty() && (!is_static() || batch_done)) AdmitWaiting(&budget, &out);

  for (const ScheduledSeq& s : out.scheduled) {
    out.num_batched_tokens += s.num_new_tokens;
    if (s.seq->first_scheduled_time == absl::InfinitePast()) {
      s.seq->first_scheduled_time = absl::Now();
    }
  }
  return out;
}

}  // namespace tandem
