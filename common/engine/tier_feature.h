#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"
#include "common/engine/kv/tiers/tier_store.h"

namespace tandem {

// KV cache tiers below the pool (kv/tiers/README.md) as an engine feature.
//
// - Write path: the pool's eviction hook (BlockPool::set_eviction_hook) copies a cached block that
//   is about to be reused (identity and bytes, on the engine thread, only when some tier lacks it
//   and could take it) and offers it to the store, which keeps it in the host tier and writes it
//   to disk behind, on its own thread. On a backend whose pool is device memory the host tier is
//   page-locked memory the backend allocated at start (Backend::AllocateHostMemory, HostArena):
//   the copy is a DMA straight into a host tier slot, enqueued behind the forward passes already
//   launched (Backend::StartBlockRead), so the engine thread neither waits for the device nor
//   copies bytes; the block is offered at a later step's OnStepBegin once its copy has landed
//   (until then no one can read it, and its slot is not handed out again). Installs likewise
//   enqueue a DMA from the loaded block's slot ahead of the next forward pass (StartBlockWrite),
//   and the block (so its slot) is held until that copy has landed (OnStepBegin). A block outside
//   the host tier's memory (no host tier, or no free slot) goes through the backend's staging
//   (no room there: the copy-out is dropped, counted; the install is synchronous). At destruction
//   the blocks still cached in the pool are written to the disk tier too (bounded time), so a
//   restarted worker finds them.
// - Read path: before the scheduler plans (BeforeSchedule), a waiting sequence whose prompt
//   continues past the pool's cached prefix with blocks some tier holds is held
//   (Scheduler::Hold: kPending, no slot, no blocks; others keep stepping) while the loader
//   thread reads them; the part of its prompt still in the pool (the prefix the load continues)
//   is pinned from then on, so that other sequences' allocations cannot evict it while the load
//   runs. At the next step's OnStepBegin the blocks that match the sequence
//   exactly (parent, tokens, salt) are written into freshly allocated pool blocks and registered
//   in the prefix cache, pinned (one reference) together with the pool prefix before them, and the
//   sequence is released: its admission takes them as a prefix hit (usage cached_tokens counts
//   them). The pin is dropped once it is admitted (AfterSchedule) or ends (OnFinish).
// - A sequence is looked up at most once (a preempted one recomputes); loads in flight and pinned
//   blocks are bounded (KvTierOptions::max_loads_in_flight, max_pinned_fraction). A sequence
//   whose load would pass the bound while others hold blocks is held too (deferred_) and looked
//   at again at each step's OnStepBegin, so it is never admitted without the blocks the tiers
//   have for it; the bound frees as the sequences before it are admitted or end. A load that is
//   the only one may pass the bound, up to what the pool can give with one block left per
//   running sequence (a request runs only with its whole prefix in the pool). A finished load
//   is installed when the pool has room for all of it (or nothing runs that could free some),
//   in order; a sequence whose prefix is in the pool is looked at again each step until
//   admitted (other loads may evict that prefix to the tiers meanwhile).
// Engine thread, except the store's threads (which touch only the store) and the ready callback
// (EngineWake::Notify).
class TierFeature final : public EngineFeature {
 public:
  // The store of `options`, its host tier in memory from backend.AllocateHostMemory on a backend
  // whose pool is device memory (page-locked on CUDA): a clear error when that cannot be had.
  static absl::StatusOr<std::unique_ptr<TierFeature>> Create(const KvTierOptions& options,
                                                             Backend& backend);
  explicit TierFeature(std::unique_ptr<KvTierStore> store);
  ~TierFeature() override;
  const char* name() const override { return "kv tiers"; }

  // After Attach (Engine::Create): installs the eviction hook and the ready callback.
  void Start();

  void OnStepBegin(std::vector<SequenceUpdate>* updates) override;  // loads land
  void BeforeSchedule() override;                                   // loads start
  void AfterSchedule(const SchedulerOutput& plan, std::vector<SequenceUpdate>* updates) override;
  // Times the forward passes that are mostly prefill: the cost a tier hit saves (reported to the
  // routers beside each tier's read cost).
  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;
  void AfterForward() override;
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;
  void AddStats(EngineStats* stats) const override;

  KvTierStore& store() { return *store_; }

 private:
  struct Load {
    Sequence* seq = nullptr;
    int64_t first_block = 0;  // the loaded blocks follow this many in the pool
    int64_t blocks = 0;       // blocks it may pin: first_block + those asked for
    // The pool's prefix (first_block blocks), held from the start of the load until its install:
    // blocks the load continues must not be evicted while it runs (other sequences' allocations
    // would evict them, and the loaded blocks would have no prefix to join).
    SequenceBlocks prefix;
  };
  // The identity of cached pool block `block` (its payload sized, not filled), or null. The
  // payload is in a host tier slot where `host_tier_memory` and one can be had, else heap memory.
  std::shared_ptr<TierBlock> Describe(int32_t block, bool host_tier_memory);
  // The identity and bytes of cached pool block `block`, read at once.
  std::shared_ptr<TierBlock> CopyOut(int32_t block);
  void OnEvict(int32_t block);
  // Offers the asynchronous copy-outs that have landed (all of them, waiting: `wait`).
  void TakeCopyOuts(bool wait);
  // Lets go of the blocks whose install copies have landed (all of them, waiting: `wait`).
  void TakeInstalls(bool wait);
  // Starts a load for `seq` when some tier holds blocks past its pool prefix; `deferred`: it is
  // held already (in deferred_ before).
  void MaybeLoad(Sequence* seq, bool deferred = false);
  void RetryDeferred();
  void Install(Load& load, const TierLoad& result);
  void Unpin(Sequence* seq);
  // Writes the pool's cached blocks to the disk tier (shutdown), within `budget`.
  void FlushPool(absl::Duration budget);

  std::unique_ptr<KvTierStore> store_;
  int slot_ = -1;
  // Copy-outs in flight on a backend whose pool is device memory (Backend::StartBlockRead): the
  // ticket and the block it fills, offered once landed (OnStepBegin).
  std::vector<std::pair<uint64_t, std::shared_ptr<TierBlock>>> copy_outs_;
  // Install copies in flight (Backend::StartBlockWrite): the ticket and the block it reads, held
  // until landed (its host tier slot must not be evicted and refilled before).
  std::vector<std::pair<uint64_t, TierBlockPtr>> installs_;
  std::unordered_map<uint64_t, Load> loads_;  // load id -> the sequence waiting for it
  std::unordered_map<Sequence*, uint64_t> load_of_;
  std::unordered_map<Sequence*, SequenceBlocks> pins_;
  // Loads done, waiting for room in the pool to be installed (in order).
  std::vector<TierLoad> landed_;
  // Held waiting sequences whose load would exceed the pinned bound now, in arrival order.
  std::vector<Sequence*> deferred_;
  int64_t pinned_blocks_ = 0;
  int64_t loading_blocks_ = 0;  // what the loads in flight may pin
  // The forward pass being timed (batched tokens 0: none).
  absl::Time forward_start_;
  int64_t forward_tokens_ = 0;
};

}  // namespace tandem
