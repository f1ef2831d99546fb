#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

enum class SchedulingPolicy {
  kFcfs,      // first come, first served
  kPriority,  // lower Sequence::priority first, then arrival
  // Benchmark baselines only. A batch is admitted when the previous one has finished, with KV
  // reserved for prompt + max_tokens; nothing joins it until it is done.
  kStatic,         // fixed shape, as static-batching servers run (HF generate, FasterTransformer):
                   // a member that finishes stays in the batch as a padding row, computed and
                   // discarded every step, its KV held, until the whole batch is done
  kStaticCompact,  // the same, but a finished member leaves the batch (its row is not computed)
};

// kStatic: a finished member of the running batch. Each step recomputes `token` at `pos` (the
// slot after the last computed one, inside its own reservation), so it costs what a decode row
// costs and never grows.
struct PaddingRow {
  SequenceBlocks blocks;
  int32_t token = 0;
  int32_t pos = 0;
};

struct SchedulerOptions {
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  int64_t max_num_seqs = 64;             // sequences per step
  int64_t max_num_batched_tokens = 512;  // tokens per step (prefill chunks + decodes)
  int64_t max_prefill_chunk = 0;         // cap on one sequence's chunk; 0: the token budget
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t num_new_tokens = 0;  // tokens [num_computed, num_computed + num_new_tokens) this step
};

struct BlockCopy {
  Sequence* seq = nullptr;
  int32_t src = 0;
  int32_t dst = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;
  std::vector<BlockCopy> block_copies;  // copy-on-write, to run before the forward pass
  std::vector<Sequence*> preempted;     // moved back to waiting this step
  std::vector<Sequence*> reserved;      // remote-prefill sequences that got their blocks this step
  int64_t num_batched_tokens = 0;
};

// Iteration-level scheduler (DESIGN §4 "Scheduler"): every step, running sequences continue
// (decodes first, then prefill chunks), then waiting sequences join while the token, sequence
// and KV-block budgets allow. When blocks run out the lowest-priority, newest running sequence
// is preempted: its blocks are freed (full ones stay in the prefix cache) and it is recomputed
// later. The oldest, highest-priority sequence is therefore never starved. Engine thread only.
class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvCacheManager* kv);

  void AddWaiting(Sequence* seq);  // a new request's sequence
  void AddRunning(Sequence* seq);  // a forked sample that already holds its parent's blocks
  // Removes a sequence from whichever queue holds it and frees its blocks.
  void Remove(Sequence* seq);
  // A kAwaitingKv sequence whose prompt KV arrived: it joins the running sequences.
  void StartAwaited(Sequence* seq);
  const std::vector<Sequence*>& awaiting() const { return awaiting_; }
  const std::vector<Sequence*>& running() const { return running_; }

  SchedulerOutput Schedule();

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_awaiting() const { return static_cast<int64_t>(awaiting_.size()); }
  // Nothing to compute (awaiting sequences need no step until their KV arrives).
  bool idle() const { return waiting_.empty() && running_.empty(); }
  bool empty() const { return idle() && awaiting_.empty(); }
  const SchedulerOptions& options() const { return options_; }
  // kStatic: the padding rows of the running batch (freed when its last member finishes).
  const std::vector<PaddingRow>& padding() const { return padding_; }
  // Fault injection (engine_faults.h): when `fail` returns true, an allocation of blocks the
  // pool could give is refused as if the pool were short. Unset (the default): never.
  void set_allocation_fault(std::function<bool()> fail) { fail_allocation_ = std::move(fail); }

 private:
  // Whether `needed` more blocks can be taken from the pool now.
  bool Fits(int64_t needed) const;
  bool Before(const Sequence* a, const Sequence* b) const;  // a is served before b
  void InsertWaiting(Sequence* seq);
  Sequence* PickVictim(const std::vector<Sequence*>& candidates) const;
  void Preempt(Sequence* seq, SchedulerOutput* out);
  // Makes room in the KV pool for `seq` to compute `num_new` more tokens, preempting others if
  // needed. False when `seq` itself had to be preempted.
  bool Reserve(Sequence* seq, int64_t num_new, SchedulerOutput* out);
  bool AdmitWaiting(int64_t* budget, SchedulerOutput* out);
  bool ReserveRemote(Sequence* seq, SchedulerOutput* out);
  void MakeWritable(Sequence* seq, int64_t begin, int64_t end, SchedulerOutput* out);
  bool is_static() const;
  // kStatic: keeps a finished running member's blocks as a padding row; false when it cannot.
  bool KeepAsPadding(Sequence* seq);
  void ReleasePaddingIfBatchDone();

  SchedulerOptions options_;
  KvCacheManager* kv_;
  std::deque<Sequence*> waiting_;    // in service order
  std::vector<Sequence*> running_;   // in service order
  std::vector<Sequence*> awaiting_;  // kAwaitingKv, in admission order
  std::function<bool()> fail_allocation_;
  std::vector<PaddingRow> padding_;
};

}  // namespace tandem
