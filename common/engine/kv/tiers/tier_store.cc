#include "common/engine/kv/tiers/tier_store.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "common/engine/kv/tiers/kv_tier_hooks.h"

namespace tandem {
namespace {

std::atomic<int64_t> load_delay_ns_for_testing{0};

}  // namespace

void KvTierStore::SetLoadDelayForTesting(absl::Duration delay) {
  load_delay_ns_for_testing.store(absl::ToInt64Nanoseconds(delay));
}

absl::StatusOr<std::unique_ptr<KvTierStore>> KvTierStore::Create(
    const KvTierOptions& options, std::shared_ptr<HostArena> host_memory) {
  if (options.host_bytes < 0) return absl::InvalidArgumentError("--kv-offload-host-memory < 0");
  if (options.write_queue_bytes < 0 || options.write_bytes_per_second < 0) {
    return absl::InvalidArgumentError("KV offload write queue and pace must be >= 0");
  }
  std::unique_ptr<KvTierStore> store(new KvTierStore(options));
  if (options.host_bytes > 0) {
    store->host_ =
        std::make_unique<HostTier>(options.host_bytes, options.listener, std::move(host_memory));
  }
  if (!options.disk_dir.empty()) {
    if (options.fingerprint == 0) {
      return absl::InvalidArgumentError("the disk tier needs the engine's KV fingerprint");
    }
    DiskTierOptions d;
    d.dir = options.disk_dir;
    d.capacity_bytes = options.disk_bytes;
    d.fingerprint = options.fingerprint;
    d.hooks = options.hooks;
    d.listener = options.listener;
    auto disk = DiskTier::Open(d);
    if (!disk.ok()) return disk.status();
    store->disk_ = std::move(disk).value();
    store->writer_ = std::thread([s = store.get()] { s->WriterLoop(); });
  }
  store->loader_ = std::thread([s = store.get()] { s->LoaderLoop(); });
  return store;
}

KvTierStore::KvTierStore(const KvTierOptions& options) : options_(options) {}

KvTierStore::~KvTierStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  write_cv_.notify_all();
  load_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (loader_.joinable()) loader_.join();
}

void KvTierStore::set_ready_callback(std::function<void()> ready) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = std::move(ready);
}

bool KvTierStore::ShouldOffer(BlockHash hash) {
  const bool host_has = host_ == nullptr || host_->Touch(hash);
  if (!disk_enabled()) return !host_has;
  // The queue before the disk index: the writer puts a block on disk before it leaves the
  // queue, so a block between the two is seen in one of them (the other order could miss it).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_.count(hash) != 0) return !host_has;
  }
  if (disk_->Touch(hash)) return !host_has;
  std::lock_guard<std::mutex> lock(mu_);
  if (write_bytes_ >= options_.write_queue_bytes && host_has) {
    ++write_drops_;  // nothing else would take it
    return false;
  }
  return true;
}

void KvTierStore::Offer(TierBlockPtr block) {
  if (host_ != nullptr) host_->Put(block);
  if (!disk_enabled() || disk_->Contains(block->hash)) return;
  const int64_t size = block->size_bytes();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_.count(block->hash) != 0) return;
    if (write_bytes_ + size > options_.write_queue_bytes) {
      ++write_drops_;
      return;
    }
    write_bytes_ += size;
    queued_[block->hash] = block;
    writes_.push_back(std::move(block));
  }
  write_cv_.notify_one();
}

TierPayload KvTierStore::AllocatePayload(size_t bytes) {
  return host_ != nullptr ? host_->TakeSlot(bytes) : TierPayload();
}

void KvTierStore::NoteDropped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++write_drops_;
}

bool KvTierStore::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return flushed_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                              [this] { return write_bytes_ == 0 || stop_; });
}

void KvTierStore::WriterLoop() {
  absl::Time next = absl::Now();  // pacing: when the next write may start
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    write_cv_.wait(lock, [this] { return stop_ || !writes_.empty(); });
    if (stop_) return;
    TierBlockPtr block = std::move(writes_.front());
    writes_.pop_front();
    const int64_t size = block->size_bytes();
    lock.unlock();
    const absl::Time now = absl::Now();
    if (next > now) absl::SleepFor(next - now);
    disk_->Put(*block);
    if (options_.write_bytes_per_second > 0) {
      next = std::max(next, now) +
             absl::Seconds(static_cast<double>(size) / options_.write_bytes_per_second);
    }
    lock.lock();
    write_bytes_ -= size;
    queued_.erase(block->hash);
    if (write_bytes_ == 0) flushed_cv_.notify_all();
    lock.unlock();
    Publish();
    lock.lock();
  }
}

int64_t KvTierStore::Probe(absl::Span<const BlockHash> hashes) const {
  int64_t n = 0;
  for (BlockHash h : hashes) {
    bool found = host_ != nullptr && host_->Contains(h);
    if (!found && disk_ != nullptr) {
      // The queue before the disk index, as Fetch: the writer puts a block on disk before it
      // leaves the queue, so a block moving from one to the other is seen in one of them.
      {
        std::lock_guard<std::mutex> lock(mu_);
        found = queued_.count(h) != 0;
      }
      if (!found) found = disk_->Contains(h);
    }
    if (!found) break;
    ++n;
  }
  return n;
}

uint64_t KvTierStore::StartLoad(std::vector<BlockHash> hashes) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_load_++;
    loads_.push_back({id, std::move(hashes), absl::Now()});
    ++in_flight_;
  }
  load_cv_.notify_one();
  return id;
}

void KvTierStore::CancelLoad(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto queued =
      std::find_if(loads_.begin(), loads_.end(), [id](const LoadJob& j) { return j.id == id; });
  ++cancelled_loads_;
  if (queued != loads_.end()) {
    loads_.erase(queued);
    --in_flight_;
    return;
  }
  auto done = std::find_if(completed_.begin(), completed_.end(),
                           [id](const TierLoad& l) { return l.id == id; });
  if (done != completed_.end()) {
    completed_.erase(done);
    return;
  }
  cancelled_.insert(id);  // running now: dropped when it finishes
}

TierBlockPtr KvTierStore::Fetch(BlockHash hash, KvTier* from) {
  *from = KvTier::kHost;
  if (host_ != nullptr) {
    if (TierBlockPtr b = host_->Get(hash)) return b;
  }
  *from = KvTier::kDisk;
  if (disk_ != nullptr) {
    {
      // Still on its way to the disk: served from the queue (counted as a disk hit).
      std::lock_guard<std::mutex> lock(mu_);
      auto it = queued_.find(hash);
      if (it != queued_.end()) {
        ++queue_hits_;
        return it->second;
      }
    }
    // Read into a host tier slot where there is one: the block is promoted, and an install
    // copies it from there.
    std::optional<TierBlock> b =
        disk_->Get(hash, [this](size_t bytes) { return AllocatePayload(bytes); });
    if (b.has_value()) {
      auto block = std::make_shared<const TierBlock>(std::move(*b));
      if (host_ != nullptr) host_->Put(block);  // promoted: the next load is a memory copy
      return block;
    }
  }
  return nullptr;
}

void KvTierStore::LoaderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    load_cv_.wait(lock, [this] { return stop_ || !loads_.empty(); });
    if (stop_) return;
    LoadJob job = std::move(loads_.front());
    loads_.pop_front();
    lock.unlock();
    if (const int64_t delay = load_delay_ns_for_testing.load(); delay > 0) {
      absl::SleepFor(absl::Nanoseconds(delay));
    }
    TierLoad done;
    done.id = job.id;
    for (BlockHash h : job.hashes) {
      const absl::Time start = absl::Now();
      KvTier from;
      TierBlockPtr b = Fetch(h, &from);
      if (b == nullptr) break;
      NoteRead(from, absl::ToDoubleSeconds(absl::Now() - start));
      done.blocks.push_back(std::move(b));
    }
    done.latency = absl::Now() - job.queued;
    if (options_.hooks != nullptr) {
      options_.hooks->OnLoad(absl::ToDoubleSeconds(done.latency),
                             static_cast<int64_t>(done.blocks.size()));
    }
    lock.lock();
    --in_flight_;
    ++loads_done_;
    if (cancelled_.erase(job.id) == 0) completed_.push_back(std::move(done));
    std::function<void()> ready = ready_;
    lock.unlock();
    Publish();
    if (ready) ready();
    lock.lock();
  }
}

std::vector<TierLoad> KvTierStore::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TierLoad> out;
  out.swap(completed_);
  return out;
}

KvTierStats KvTierStore::stats() const {
  KvTierStats s;
  s.enabled = true;
  if (host_ != nullptr) s.tier[static_cast<int>(KvTier::kHost)] = host_->counters();
  if (disk_ != nullptr) s.tier[static_cast<int>(KvTier::kDisk)] = disk_->counters();
  std::lock_guard<std::mutex> lock(mu_);
  s.tier[static_cast<int>(KvTier::kDisk)].hits += queue_hits_;
  s.write_queue_blocks = static_cast<int64_t>(queued_.size());
  s.write_queue_bytes = write_bytes_;
  s.write_drops = write_drops_;
  s.loads = loads_done_;
  s.loads_in_flight = in_flight_;
  s.cancelled_loads = cancelled_loads_;
  s.loaded_blocks = installed_;
  s.pinned_blocks = pinned_;
  for (int t = 0; t < 2; ++t) s.tier[t].load_seconds_per_block = read_seconds_[t];
  s.prefill_seconds_per_block = prefill_seconds_per_block_;
  return s;
}

void KvTierStore::NoteRead(KvTier tier, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  double& mean = read_seconds_[static_cast<int>(tier)];
  mean = mean == 0 ? seconds : mean + kCostSmoothing * (seconds - mean);
}

void KvTierStore::NotePrefill(double seconds_per_block) {
  std::lock_guard<std::mutex> lock(mu_);
  double& mean = prefill_seconds_per_block_;
  mean = mean == 0 ? seconds_per_block : mean + kCostSmoothing * (seconds_per_block - mean);
}

void KvTierStore::NoteInstalled(int64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  installed_ += blocks;
}

void KvTierStore::SetPinned(int64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  pinned_ = blocks;
}

void KvTierStore::Publish() const {
  if (options_.hooks != nullptr) options_.hooks->OnStats(stats());
}

}  // namespace tandem
