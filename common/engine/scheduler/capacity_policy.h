#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

// Capacity policy: what fits into a step (sequences, tokens, KV blocks) and who yields when KV
// blocks run out. Pure decisions over the state they are given; the Scheduler applies them.

enum class SchedulingPolicy {
  kFcfs,      // first come, first served
  kPriority,  // lower Sequence::priority first, then arrival
};

// Service order: whether `a` is served before `b`. The earlier one is admitted first, scheduled
// first within its kind of row, and preempted last. Ties (samples of one request) go by index.
bool ServedBefore(SchedulingPolicy policy, const Sequence& a, const Sequence& b);

// Whether one more sequence may hold blocks, `num_active` (running and awaiting KV) already do.
bool HasSequenceSlot(int64_t num_active, int64_t max_num_seqs);

// Whether a step with `budget_left` tokens of its max_num_batched_tokens unspent can take one
// more row.
bool HasTokenBudget(int64_t budget_left);

// Whether waiting sequences may join this step: not after a preemption (there is no room to
// spare, and the preempted sequence would otherwise be readmitted at once).
bool MayAdmitAfter(int64_t num_preempted_this_step);

// Blocks the pool must give for `blocks` to have positions [begin, end) written: new blocks past
// its table, plus a private copy of every block in that range that another sequence shares.
int64_t BlocksToWrite(const KvCacheManager& kv, const BlockPool& pool, const SequenceBlocks& blocks,
                      int64_t begin, int64_t end);

// Whether `needed` blocks can be taken from a pool with `available` free or evictable ones.
bool BlocksFit(int64_t needed, int64_t available);

// The running sequence to preempt when blocks run out: the one served last, so the oldest,
// highest-priority sequence is never starved. `running` is in service order and not empty.
Sequence* PreemptionVictim(const std::vector<Sequence*>& running);

}  // namespace tandem
