#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/engine/kv/tiers/disk_tier.h"
#include "common/engine/kv/tiers/host_tier.h"
#include "common/engine/kv/tiers/tier_block.h"
#include "common/engine/kv/tiers/tier_options.h"

namespace tandem {

// A finished load: the leading blocks of the asked-for hashes that some tier held and that passed
// their checks (possibly none), in order.
struct TierLoad {
  uint64_t id = 0;
  std::vector<TierBlockPtr> blocks;
  absl::Duration latency;  // queued -> done
};

// The tiers below the pool and their two threads (README.md): the writer drains the
// write-behind queue into the disk tier, paced; the loader serves loads (host tier first, then
// disk) and calls the ready callback. Every method is thread-safe; the engine thread calls all
// but the ready callback, which runs on the loader thread.
class KvTierStore {
 public:
  // `host_memory`: the host tier's memory on a worker whose pool is device memory (HostArena;
  // page-locked there); null: the host tier keeps heap blocks (a CPU worker).
  static absl::StatusOr<std::unique_ptr<KvTierStore>> Create(
      const KvTierOptions& options, std::shared_ptr<HostArena> host_memory = nullptr);
  ~KvTierStore();  // stops both threads (queued writes are dropped)

  // Called on the loader thread after each load finished (must not block).
  void set_ready_callback(std::function<void()> ready);

  // --- Write path ---
  // Whether a block leaving the pool should be copied out: false when every tier has it already
  // (touched as used now) or none could take it (the write queue is full: counted as a drop).
  bool ShouldOffer(BlockHash hash);
  // A payload of `bytes` in the host tier's memory for a block about to be copied out
  // (HostTier::TakeSlot); empty without one or when no slot can be had (then the caller uses heap
  // memory: the block is queued for the disk tier only).
  TierPayload AllocatePayload(size_t bytes);
  // Keeps the block in the host tier and queues it for the disk tier (a full queue drops it,
  // counted). Never blocks on I/O.
  void Offer(TierBlockPtr block);
  // A block ShouldOffer accepted that the engine could not copy out after all (no staging room
  // for an asynchronous device copy, or the copy failed): counted as a drop.
  void NoteDropped();
  // Waits until the write queue is empty (shutdown, tests), at most `timeout`.
  bool Flush(absl::Duration timeout);

  // --- Read path ---
  // How many leading `hashes` some tier holds, the write-behind queue included (as far as the
  // indexes know: a file may still fail its checks at load).
  int64_t Probe(absl::Span<const BlockHash> hashes) const;
  // Queues a load of the leading blocks of `hashes`; returns its id.
  uint64_t StartLoad(std::vector<BlockHash> hashes);
  // Forgets a load (its result, when it comes, is dropped).
  void CancelLoad(uint64_t id);
  std::vector<TierLoad> TakeCompleted();

  // The engine's side of the numbers: blocks installed into the pool, blocks pinned now.
  void NoteInstalled(int64_t blocks);
  void SetPinned(int64_t blocks);
  // The engine's measurement of one step's prefill: seconds per block of prompt tokens computed.
  // Kept as a recent mean (stats().prefill_seconds_per_block) beside each tier's read cost.
  void NotePrefill(double seconds_per_block);
  KvTierStats stats() const;
  // Reports stats() to the hooks (also done after every write and load).
  void Publish() const;
  const KvTierOptions& options() const { return options_; }
  bool disk_enabled() const { return disk_ != nullptr && disk_->enabled(); }
  // Tests only: every store's loader waits this long before each load (a slow tier, so that the
  // engine steps, and evicts, while loads run). Zero (the default) in production.
  static void SetLoadDelayForTesting(absl::Duration delay);

 private:
  struct LoadJob {
    uint64_t id;
    std::vector<BlockHash> hashes;
    absl::Time queued;
  };
  explicit KvTierStore(const KvTierOptions& options);
  void WriterLoop();
  void LoaderLoop();
  // The block from the first tier that has it (`from`: which one), or null.
  TierBlockPtr Fetch(BlockHash hash, KvTier* from);
  void NoteRead(KvTier tier, double seconds);
  // Weight of a new measurement in the recent means of the costs.
  static constexpr double kCostSmoothing = 0.1;

  const KvTierOptions options_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;

  mutable std::mutex mu_;
  std::condition_variable write_cv_, load_cv_, flushed_cv_;
  bool stop_ = false;
  std::deque<TierBlockPtr> writes_;
  // The blocks in writes_ (and the one being written): loads find them here too.
  std::unordered_map<BlockHash, TierBlockPtr> queued_;
  int64_t write_bytes_ = 0;  // of writes_ and the one being written
  int64_t write_drops_ = 0;
  std::deque<LoadJob> loads_;
  std::unordered_set<uint64_t> cancelled_;
  std::vector<TierLoad> completed_;
  uint64_t next_load_ = 1;
  int64_t loads_done_ = 0;
  int64_t cancelled_loads_ = 0;
  int64_t in_flight_ = 0;
  int64_t installed_ = 0;
  int64_t queue_hits_ = 0;  // loads served from the write-behind queue
  int64_t pinned_ = 0;
  std::array<double, 2> read_seconds_ = {0, 0};  // per tier, recent mean per block
  double prefill_seconds_per_block_ = 0;
  std::function<void()> ready_;
  std::thread writer_, loader_;
};

}  // namespace tandem
