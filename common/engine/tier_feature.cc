// KV cache tiers as an engine feature (tier_feature.h): copy-out at eviction, held loads,
// installation of loaded blocks into the prefix cache.

#include "common/engine/tier_feature.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {
namespace {

// The sequence's "looked up already" mark.
struct Tried : FeatureState {
  std::unique_ptr<FeatureState> Clone() const override { return std::make_unique<Tried>(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierFeature>> TierFeature::Create(const KvTierOptions& options,
                                                                 Backend& backend) {
  std::shared_ptr<HostArena> arena;
  if (options.host_bytes > 0 && backend.SupportsAsyncBlockCopies()) {
    const size_t block_bytes = backend.kv_spec().bytes_per_block();
    absl::StatusOr<HostMemory> memory =
        backend.AllocateHostMemory(static_cast<size_t>(options.host_bytes));
    if (!memory.ok()) {
      return absl::Status(
          memory.status().code(),
          absl::StrCat("KV host tier (--kv-offload-host-memory ", options.host_bytes,
                       " bytes): ", memory.status().message(),
                       "; give it less (page-locked memory is RAM the OS can neither swap nor "
                       "reclaim)"));
    }
    arena = HostArena::Create(memory->data, memory->bytes, block_bytes, memory->pinned);
    TLOG(INFO) << "KV tiers: host tier in " << memory->bytes << " bytes of "
               << (memory->pinned ? "page-locked" : "ordinary") << " host memory ("
               << arena->slots() << " blocks of " << block_bytes << " bytes)";
    if (arena->slots() == 0) {
      TLOG(WARNING) << "KV tiers: --kv-offload-host-memory holds no block of " << block_bytes
                    << " bytes: the host tier keeps nothing";
    }
  }
  absl::StatusOr<std::unique_ptr<KvTierStore>> store = KvTierStore::Create(options, arena);
  if (!store.ok()) return store.status();
  return std::make_unique<TierFeature>(std::move(store).value());
}

TierFeature::TierFeature(std::unique_ptr<KvTierStore> store) : store_(std::move(store)) {}

TierFeature::~TierFeature() {
  if (slot_ < 0) return;  // never started
  core().pool().set_eviction_hook(nullptr);
  store_->set_ready_callback(nullptr);
  TakeCopyOuts(/*wait=*/true);
  TakeInstalls(/*wait=*/true);
  if (store_->disk_enabled()) FlushPool(absl::Seconds(10));
  store_.reset();  // joins the store's threads
}

void TierFeature::Start() {
  slot_ = core().AllocateFeatureSlot();
  core().pool().set_eviction_hook([this](int32_t block) { OnEvict(block); });
  EngineWake* wake = &core().wake();
  store_->set_ready_callback([wake] { wake->Notify(); });
}

std::shared_ptr<TierBlock> TierFeature::Describe(int32_t block, bool host_tier_memory) {
  const std::optional<BlockPool::CachedIdentity> id = core().pool().Identity(block);
  if (!id.has_value()) return nullptr;
  const KvCacheSpec& spec = core().backend().kv_spec();
  auto out = std::make_shared<TierBlock>();
  out->hash = id->hash;
  out->parent = id->parent;
  out->salt = id->salt_hash;
  out->tokens.assign(id->tokens.begin(), id->tokens.end());
  const size_t bytes = spec.bytes_per_block_layer() * spec.num_layers;
  if (host_tier_memory) out->payload = store_->AllocatePayload(bytes);
  if (out->payload.empty()) out->payload = TierPayload(bytes);
  return out;
}

std::shared_ptr<TierBlock> TierFeature::CopyOut(int32_t block) {
  std::shared_ptr<TierBlock> out = Describe(block, /*host_tier_memory=*/false);
  if (out == nullptr) return nullptr;
  Backend& backend = core().backend();
  const KvCacheSpec& spec = backend.kv_spec();
  const size_t layer_bytes = spec.bytes_per_block_layer();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    uint8_t* dst = out->payload.data() + l * layer_bytes;
    if (const uint8_t* src = backend.HostBlockRegion(l, block); src != nullptr) {
      std::memcpy(dst, src, layer_bytes);
    } else if (!backend.ReadBlockRegion(l, block, dst).ok()) {
      return nullptr;
    }
  }
  return out;
}

void TierFeature::OnEvict(int32_t block) {
  const std::optional<BlockHash> hash = core().pool().HashOf(block);
  if (!hash.has_value() || !store_->ShouldOffer(*hash)) return;
  Backend& backend = core().backend();
  if (!backend.SupportsAsyncBlockCopies()) {
    if (std::shared_ptr<TierBlock> b = CopyOut(block)) store_->Offer(std::move(b));
    return;
  }
  // Straight into a host tier slot where one can be had (no host copy), else through staging.
  std::shared_ptr<TierBlock> b = Describe(block, /*host_tier_memory=*/true);
  if (b == nullptr) return;
  const std::optional<uint64_t> ticket = backend.StartBlockRead(block, b->payload.data());
  if (!ticket.has_value()) {
    store_->NoteDropped();  // every staging slot busy: the write-behind never waits
    return;
  }
  copy_outs_.emplace_back(*ticket, std::move(b));
}

void TierFeature::TakeCopyOuts(bool wait) {
  if (copy_outs_.empty()) return;
  Backend& backend = core().backend();
  size_t kept = 0;
  for (auto& [ticket, block] : copy_outs_) {
    const absl::StatusOr<bool> landed = backend.PollBlockCopy(ticket, wait);
    if (landed.ok() && !*landed) {
      copy_outs_[kept++] = {ticket, std::move(block)};
    } else if (landed.ok()) {
      store_->Offer(std::move(block));
    } else {
      TLOG(WARNING) << "KV tiers: a block copy-out failed: " << landed.status();
      store_->NoteDropped();
    }
  }
  copy_outs_.resize(kept);
}

void TierFeature::TakeInstalls(bool wait) {
  if (installs_.empty()) return;
  Backend& backend = core().backend();
  std::erase_if(installs_, [&](const std::pair<uint64_t, TierBlockPtr>& install) {
    const absl::StatusOr<bool> landed = backend.PollBlockCopy(install.first, wait);
    // A failed copy is reported by the forward pass (the stream's error): let go of it too.
    return !landed.ok() || *landed;
  });
}

void TierFeature::BeforeSchedule() {
  if (static_cast<int64_t>(loads_.size()) >= store_->options().max_loads_in_flight) return;
  // The sequences the scheduler could admit soon: the head of the queue, a batch's worth.
  std::vector<Sequence*> candidates;
  const int64_t look = core().options().scheduler.max_num_seqs;
  for (Sequence* seq : core().scheduler().waiting()) {
    if (static_cast<int64_t>(candidates.size()) >= look) break;
    if (seq->features.get<Tried>(slot_) == nullptr) candidates.push_back(seq);
  }
  for (Sequence* seq : candidates) MaybeLoad(seq);
}

void TierFeature::MaybeLoad(Sequence* seq, bool deferred) {
  if (static_cast<int64_t>(loads_.size()) >= store_->options().max_loads_in_flight) {
    if (deferred) deferred_.push_back(seq);
    return;
  }
  const BlockPool& pool = core().pool();
  const int64_t bs = core().kv().block_size();
  // As AcquirePrefix: blocks wholly inside the first num_tokens - 1 tokens.
  const int64_t max_blocks = (seq->num_tokens() - 1) / bs;
  std::vector<BlockHash> hashes(std::max<int64_t>(0, max_blocks));
  ComputeBlockHashes(absl::Span<const int32_t>(seq->tokens).subspan(0, hashes.size() * bs), bs,
                     seq->blocks.salt_hash, hashes.data());
  int64_t in_pool = 0;
  while (in_pool < max_blocks && pool.IsCached(hashes[in_pool])) ++in_pool;
  int64_t found = in_pool < max_blocks
                      ? store_->Probe(absl::Span<const BlockHash>(hashes).subspan(in_pool))
                      : 0;
  if (found == 0) {
    // Nothing in the tiers past the pool's prefix. With a prefix in the pool, looked at again
    // at the next step: other sequences' loads may evict it before this one is admitted (it is
    // in the tiers then).
    if (in_pool == 0) seq->features.set(slot_, std::make_unique<Tried>());
    if (deferred) core().scheduler().Release(seq);
    return;
  }
  const auto limit =
      static_cast<int64_t>(store_->options().max_pinned_fraction * pool.num_blocks());
  // Over the bound on pinned blocks (unless it alone is over): held, not admitted, until the
  // loads and pins before it are taken (RetryDeferred); admitting it would recompute what the
  // tiers hold.
  const int64_t held = pinned_blocks_ + loading_blocks_;
  if (held > 0 && held + in_pool + found > limit) {
    if (!deferred) core().scheduler().Hold(seq);
    deferred_.push_back(seq);
    return;
  }
  seq->features.set(slot_, std::make_unique<Tried>());
  // A prefix longer than the bound: its head only -- unless this load is the only one. A request
  // needs its whole prefix in the pool to run, so the first in line may load what the pool can
  // give without taking a running sequence's next block (else its tail would be recomputed into
  // the same blocks).
  int64_t cap = limit;
  if (held == 0) {
    cap = std::max(limit, pool.num_available() - core().scheduler().num_running());
  }
  found = std::min(found, cap - in_pool);
  if (found <= 0) {
    if (deferred) core().scheduler().Release(seq);
    return;
  }
  if (!deferred) core().scheduler().Hold(seq);
  const uint64_t id = store_->StartLoad(
      std::vector<BlockHash>(hashes.begin() + in_pool, hashes.begin() + in_pool + found));
  Load& load = loads_[id];
  load.seq = seq;
  load.first_block = in_pool;
  load.blocks = in_pool + found;
  // The pool's prefix is pinned until the install (counted in loading_blocks_ already).
  load.prefix.salt_hash = seq->blocks.salt_hash;
  core().kv().AcquirePrefix(absl::Span<const int32_t>(seq->tokens).subspan(0, in_pool * bs + 1),
                            &load.prefix);
  load_of_[seq] = id;
  loading_blocks_ += in_pool + found;
}

void TierFeature::OnStepBegin(std::vector<SequenceUpdate>* /*updates*/) {
  TakeCopyOuts(/*wait=*/false);
  TakeInstalls(/*wait=*/false);
  store_->Publish();
  if (!loads_.empty()) {
    for (TierLoad& result : store_->TakeCompleted()) landed_.push_back(std::move(result));
  }
  // Installed in order, each when the pool has room for it: while sequences run (and will free
  // blocks), a load is kept rather than installed in part (the rest would be recomputed).
  std::vector<TierLoad> landed;
  landed.swap(landed_);
  for (TierLoad& result : landed) {
    auto it = loads_.find(result.id);
    if (it == loads_.end()) continue;  // its sequence ended meanwhile
    // The prefix is held already: the loaded blocks are what the pool must find room for.
    const int64_t need = static_cast<int64_t>(result.blocks.size());
    if (!landed_.empty() ||
        (need > core().pool().num_available() && core().scheduler().num_running() > 0)) {
      landed_.push_back(std::move(result));
      continue;
    }
    Load load = std::move(it->second);
    loading_blocks_ -= load.blocks;
    loads_.erase(it);
    load_of_.erase(load.seq);
    Install(load, result);
    core().scheduler().Release(load.seq);
  }
  RetryDeferred();
}

void TierFeature::RetryDeferred() {
  // Here rather than in BeforeSchedule, which an engine whose only sequences are held skips.
  if (deferred_.empty()) return;
  std::vector<Sequence*> deferred;
  deferred.swap(deferred_);
  for (Sequence* seq : deferred) MaybeLoad(seq, /*deferred=*/true);
}

void TierFeature::Install(Load& load, const TierLoad& result) {
  Sequence* seq = load.seq;
  KvCacheManager& kv = core().kv();
  BlockPool& pool = core().pool();
  Backend& backend = core().backend();
  const KvCacheSpec& spec = backend.kv_spec();
  const size_t layer_bytes = spec.bytes_per_block_layer();
  const int64_t bs = kv.block_size();
  SequenceBlocks pin;
  pin.salt_hash = seq->blocks.salt_hash;
  // The pool's prefix as it is now: the part the load continues (pinned) or more.
  kv.AcquirePrefix(seq->tokens, &pin);
  const int64_t have = static_cast<int64_t>(pin.table.size());
  const int64_t end = load.first_block + static_cast<int64_t>(result.blocks.size());
  int64_t installed = 0;
  if (have >= load.first_block) {
    for (int64_t i = have; i < end; ++i) {
      const TierBlockPtr& loaded = result.blocks[i - load.first_block];
      const TierBlock& b = *loaded;
      const BlockHash parent = i == 0 ? kNoParentHash : pin.hashes[i - 1];
      const auto tokens = absl::Span<const int32_t>(seq->tokens).subspan(i * bs, bs);
      // Exactly the block this sequence needs, as a pool hit is checked.
      if (b.parent != parent || b.salt != pin.salt_hash ||
          absl::Span<const int32_t>(b.tokens) != tokens ||
          b.payload.size() != layer_bytes * spec.num_layers || pool.IsCached(b.hash)) {
        break;
      }
      std::optional<int32_t> block = pool.Allocate();
      if (!block.has_value()) break;
      // Enqueued ahead of the next forward pass where the backend can (the block, and so its
      // host tier slot, held until the copy has landed); else written now.
      bool written = false;
      if (backend.SupportsAsyncBlockCopies()) {
        if (const std::optional<uint64_t> t = backend.StartBlockWrite(*block, b.payload.data())) {
          installs_.emplace_back(*t, loaded);
          written = true;
        }
      }
      for (int64_t l = 0; l < spec.num_layers && !written; ++l) {
        const uint8_t* src = b.payload.data() + l * layer_bytes;
        if (uint8_t* dst = backend.HostBlockRegion(l, *block); dst != nullptr) {
          std::memcpy(dst, src, layer_bytes);
        } else if (!backend.WriteBlockRegion(l, *block, src).ok()) {
          break;
        }
        written = l + 1 == spec.num_layers;
      }
      if (!written || !pool.Register(*block, b.hash, b.parent, b.tokens, b.salt)) {
        pool.Release(*block);
        break;
      }
      pin.table.push_back(*block);
      pin.hashes.push_back(b.hash);
      pin.registered = static_cast<int64_t>(pin.table.size());
      ++installed;
    }
  }
  kv.Free(&load.prefix);  // held by `pin` now, with what was installed after it
  store_->NoteInstalled(installed);
  if (installed == 0) {
    kv.Free(&pin);
    return;
  }
  pinned_blocks_ += static_cast<int64_t>(pin.table.size());
  store_->SetPinned(pinned_blocks_);
  pins_[seq] = std::move(pin);
}

void TierFeature::Unpin(Sequence* seq) {
  auto it = pins_.find(seq);
  if (it == pins_.end()) return;
  pinned_blocks_ -= static_cast<int64_t>(it->second.table.size());
  // Room under the bound: the deferred are looked at in the next step, which must come even if
  // nothing else runs.
  if (!deferred_.empty()) core().wake().Notify();
  store_->SetPinned(pinned_blocks_);
  core().kv().Free(&it->second);
  pins_.erase(it);
}

void TierFeature::AfterSchedule(const SchedulerOutput& plan,
                                std::vector<SequenceUpdate>* /*updates*/) {
  if (pins_.empty()) return;
  // Admitted: the sequence holds its own references on the blocks now.
  for (const ScheduledSeq& s : plan.scheduled) Unpin(s.seq);
  for (Sequence* seq : plan.reserved) Unpin(seq);
}

void TierFeature::BeforeForward(const SchedulerOutput& plan,
                                const std::vector<Sequence*>& /*sampled*/,
                                ForwardBatch* /*batch*/) {
  int64_t prefill = 0, total = 0;
  for (const ScheduledSeq& s : plan.scheduled) {
    total += s.num_new_tokens;
    const int64_t prompt_left = s.seq->prompt_len - s.seq->num_computed;
    prefill += std::clamp<int64_t>(prompt_left, 0, s.num_new_tokens);
  }
  // Only passes that are mostly prefill say what prefilling costs; a block's worth at least.
  const bool timed = prefill * 2 >= total && prefill >= core().backend().kv_spec().block_size;
  forward_tokens_ = timed ? total : 0;
  if (timed) forward_start_ = absl::Now();
}

void TierFeature::AfterForward() {
  if (forward_tokens_ == 0) return;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - forward_start_);
  store_->NotePrefill(seconds / static_cast<double>(forward_tokens_) *
                      static_cast<double>(core().backend().kv_spec().block_size));
  forward_tokens_ = 0;
}

void TierFeature::OnFinish(Sequence* seq, FinishReason /*reason*/, SequenceUpdate* /*update*/) {
  std::erase(deferred_, seq);
  // Its blocks free room for loads kept for lack of it: the next step must come even if nothing
  // else runs.
  if (!landed_.empty() || !deferred_.empty()) core().wake().Notify();
  auto it = load_of_.find(seq);
  if (it != load_of_.end()) {
    store_->CancelLoad(it->second);
    Load& load = loads_[it->second];
    loading_blocks_ -= load.blocks;
    core().kv().Free(&load.prefix);
    loads_.erase(it->second);
    load_of_.erase(it);
    if (!deferred_.empty()) core().wake().Notify();
  }
  Unpin(seq);
}

void TierFeature::AddStats(EngineStats* stats) const { stats->kv_tiers = store_->stats(); }

void TierFeature::FlushPool(absl::Duration budget) {
  const absl::Time deadline = absl::Now() + budget;
  BlockPool& pool = core().pool();
  const int64_t queue = store_->options().write_queue_bytes;
  int64_t offered = 0;
  for (int32_t block = 0; block < pool.num_blocks() && store_->disk_enabled(); ++block) {
    const std::optional<BlockHash> hash = pool.HashOf(block);
    if (!hash.has_value() || !store_->ShouldOffer(*hash)) continue;
    // Room in the queue first (this is shutdown: waiting is fine, within the budget).
    while (store_->stats().write_queue_bytes >= queue && absl::Now() < deadline) {
      store_->Flush(std::min(absl::Milliseconds(100), deadline - absl::Now()));
    }
    if (absl::Now() >= deadline) break;
    if (std::shared_ptr<TierBlock> b = CopyOut(block)) {
      store_->Offer(std::move(b));
      ++offered;
    }
  }
  const bool done = store_->Flush(std::max(absl::ZeroDuration(), deadline - absl::Now()));
  TLOG(INFO) << "KV tiers: " << offered << " cached pool blocks written to disk at shutdown"
             << (done ? "" : " (time budget spent: the rest are dropped)");
}

}  // namespace tandem
