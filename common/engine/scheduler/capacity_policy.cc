#include "common/engine/scheduler/capacity_policy.h"

#include <algorithm>

#include "common/base/log.h"

namespace tandem {

bool ServedBefore(SchedulingPolicy policy, const Sequence& a, const Sequence& b) {
  if (policy == SchedulingPolicy::kPriority && a.priority != b.priority) {
    return a.priority < b.priority;
  }
  if (a.arrival_order != b.arrival_order) return a.arrival_order < b.arrival_order;
  return a.index < b.index;
}

bool HasSequenceSlot(int64_t num_active, int64_t max_num_seqs) { return num_active < max_num_seqs; }

bool HasTokenBudget(int64_t budget_left) { return budget_left > 0; }

bool MayAdmitAfter(int64_t num_preempted_this_step) { return num_preempted_this_step == 0; }

int64_t BlocksToWrite(const KvCacheManager& kv, const BlockPool& /*pool*/,
                      const SequenceBlocks& blocks, int64_t begin, int64_t end) {
  return kv.BlocksNeeded(blocks, end) + kv.CopiesNeeded(blocks, begin, end);
}

bool BlocksFit(int64_t needed, int64_t available) { return needed <= available; }

Sequence* PreemptionVictim(const std::vector<Sequence*>& running) {
  TANDEM_CHECK(!running.empty()) << "no running sequence to preempt";
  return running.back();
}

}  // namespace tandem
