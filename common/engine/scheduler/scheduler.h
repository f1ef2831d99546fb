#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/scheduler/batching_policy.h"
#include "common/engine/scheduler/capacity_policy.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

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

// Iteration-level scheduler (README.md): holds the waiting, running, pending and awaiting queues
// and, every step, applies the capacity policy (capacity_policy.h: what fits, who is preempted) and
// the batch-shape policy (batch_shape_policy.h: decodes, speculation slots and prefill chunks)
// to them: running sequences continue (decodes first, then prefill chunks), then waiting
// sequences join while the token, sequence and KV-block budgets allow and the batching policy
// (batching_policy.h: continuous in production) lets them. When blocks run out the
// sequence served last is preempted: its blocks are freed (full ones stay in the prefix cache)
// and it is recomputed later. Engine thread only.
class Scheduler {
 public:
  // `batching` null: ContinuousBatching (production).
  Scheduler(const SchedulerOptions& options, KvCacheManager* kv,
            std::unique_ptr<BatchingPolicy> batching = nullptr);
  ~Scheduler();

  void AddWaiting(Sequence* seq);  // a new request's sequence
  void AddRunning(Sequence* seq);  // a forked sample that already holds its parent's blocks
  // Removes a sequence from whichever queue holds it and frees its blocks.
  void Remove(Sequence* seq);
  // Waiting for an external resource (README): Hold makes `seq` wait for one more resource,
  // Release says one is ready. A held sequence that was waiting becomes kPending (not admitted:
  // no slot, no blocks; others are admitted past it); one that was running becomes kAwaiting
  // (keeps its slot and blocks, is not scheduled; its drafts are dropped). When its last hold
  // is released it is waiting or running again, in service order. Remote-prefill sequences are
  // admitted straight into kAwaiting holding one wait, released when their KV arrived.
  void Hold(Sequence* seq);
  void Release(Sequence* seq);
  const std::vector<Sequence*>& awaiting() const { return awaiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }  // in service order
  const std::vector<Sequence*>& pending() const { return pending_; }

  SchedulerOutput Schedule();

  // Sequences not admitted: waiting and pending.
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size() + pending_.size()); }
  int64_t num_pending() const { return static_cast<int64_t>(pending_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_awaiting() const { return static_cast<int64_t>(awaiting_.size()); }
  // Nothing to compute (pending and awaiting sequences need no step until they are released).
  bool idle() const { return waiting_.empty() && running_.empty(); }
  bool empty() const { return idle() && awaiting_.empty() && pending_.empty(); }
  const SchedulerOptions& options() const { return options_; }
  // Fault injection (engine_faults.h): when `fail` returns true, an allocation of blocks the
  // pool could give is refused as if the pool were short. Unset (the default): never.
  void set_allocation_fault(std::function<bool()> fail) { fail_allocation_ = std::move(fail); }

 private:
  // Whether `needed` more blocks can be taken from the pool now.
  bool Fits(int64_t needed) const;
  void InsertWaiting(Sequence* seq);
  void Preempt(Sequence* seq, SchedulerOutput* out);
  // Makes room in the KV pool for `seq` to compute `num_new` more tokens, preempting others if
  // needed. False when `seq` itself had to be preempted.
  bool Reserve(Sequence* seq, int64_t num_new, SchedulerOutput* out);
  void AdmitWaiting(int64_t* budget, SchedulerOutput* out);
  bool ReserveRemote(Sequence* seq, SchedulerOutput* out);
  void MakeWritable(Sequence* seq, int64_t begin, int64_t end, SchedulerOutput* out);

  SchedulerOptions options_;
  KvCacheManager* kv_;
  std::deque<Sequence*> waiting_;    // in service order
  std::vector<Sequence*> running_;   // in service order
  std::vector<Sequence*> awaiting_;  // kAwaiting, in the order they were held
  std::vector<Sequence*> pending_;   // kPending, in the order they were held
  std::function<bool()> fail_allocation_;
  std::unique_ptr<BatchingPolicy> batching_;
};

}  // namespace tandem
