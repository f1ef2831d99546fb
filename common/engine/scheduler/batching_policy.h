#pragma once

#include <cstdint>

#include "common/engine/scheduler/sequence.h"

namespace tandem {

// Batching policy: when waiting sequences may join the running batch and how much KV an admitted
// sequence reserves, beside the capacity policy (what fits) and the batch-shape policy (how rows
// are formed). Production runs ContinuousBatching, the Scheduler's default; a binary may give the
// Scheduler another through EngineOptions::extensions (the static-batching benchmark baselines,
// tests/bench/static_batching). Engine thread only.
class BatchingPolicy {
 public:
  virtual ~BatchingPolicy() = default;

  // Whether waiting sequences may be admitted in a step that began with `batch_running` (some
  // sequence was running when the step started).
  virtual bool MayAdmit(bool batch_running) const = 0;
  // The positions whose blocks an admitted sequence takes at admission; its first chunk ends at
  // `chunk_end` (the least it can take).
  virtual int64_t ReserveTo(const Sequence& seq, int64_t chunk_end) const = 0;
  // A running sequence is leaving (finished or aborted, not preempted), before the scheduler
  // frees its blocks; `others_running`: sequences are still running. A policy may keep the
  // blocks (moving them out of `seq->blocks`); it frees them itself later.
  virtual void OnLeave(Sequence* seq, bool others_running) {}
  // A sequence left the scheduler (removed or preempted) and its blocks were freed; `running`:
  // sequences are still running.
  virtual void AfterRemoval(bool running) {}
};

// Iteration-level (continuous) batching: waiting sequences join at any step, an admitted
// sequence takes the blocks of its first chunk, and a leaving one gives its blocks back at once.
class ContinuousBatching final : public BatchingPolicy {
 public:
  bool MayAdmit(bool /*batch_running*/) const override { return true; }
  int64_t ReserveTo(const Sequence& /*seq*/, int64_t chunk_end) const override { return chunk_end; }
};

}  // namespace tandem
