// The store's threads: write-behind reaches the disk without the caller waiting, a full queue
// drops (counted) instead of blocking, loads return the leading blocks some tier holds (host
// first), a cancelled load's result never comes back, and the ready callback fires per load.
#include "common/engine/kv/tiers/tier_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>

#include "tests/unit/common/engine/kv/tiers/tier_test_util.h"

namespace tandem {
namespace {

using tier_testing::Chain;
using tier_testing::ScratchDir;

std::vector<TierLoad> WaitForLoads(KvTierStore* store, size_t n) {
  std::vector<TierLoad> out;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (out.size() < n && absl::Now() < deadline) {
    for (TierLoad& l : store->TakeCompleted()) out.push_back(std::move(l));
    absl::SleepFor(absl::Milliseconds(1));
  }
  return out;
}

std::vector<BlockHash> Hashes(const std::vector<std::shared_ptr<TierBlock>>& chain) {
  std::vector<BlockHash> out;
  for (const auto& b : chain) out.push_back(b->hash);
  return out;
}

TEST(KvTierStoreTest, WriteBehindThenLoadFromDiskAfterRestart) {
  ScratchDir dir;
  KvTierOptions o;
  o.disk_dir = dir.path();
  o.disk_bytes = 1 << 20;
  o.fingerprint = 9;
  const auto chain = Chain(5);
  {
    auto store = KvTierStore::Create(o);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE((*store)->ShouldOffer(chain[i]->hash));
      (*store)->Offer(chain[i]);
    }
    ASSERT_TRUE((*store)->Flush(absl::Seconds(10)));
    EXPECT_FALSE((*store)->ShouldOffer(chain[0]->hash));  // already there
    EXPECT_EQ((*store)->stats().tier[1].blocks, 4);
  }
  auto store = KvTierStore::Create(o);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Probe(Hashes(chain)), 4);
  std::atomic<int> ready{0};
  (*store)->set_ready_callback([&] { ++ready; });
  const uint64_t id = (*store)->StartLoad(Hashes(chain));
  auto loads = WaitForLoads(store->get(), 1);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].id, id);
  ASSERT_EQ(loads[0].blocks.size(), 4u);  // the fifth was never stored
  for (int i = 0; i < 4; ++i) EXPECT_EQ(loads[0].blocks[i]->payload, chain[i]->payload);
  EXPECT_EQ(ready.load(), 1);
  const KvTierStats s = (*store)->stats();
  EXPECT_EQ(s.tier[1].hits, 4);
  EXPECT_EQ(s.tier[1].misses, 1);
  EXPECT_EQ(s.loads, 1);
  // The disk reads were timed (what routers weigh a disk hit by); the host tier read nothing.
  EXPECT_GT(s.tier[1].load_seconds_per_block, 0);
  EXPECT_EQ(s.tier[0].load_seconds_per_block, 0);
  EXPECT_EQ(s.prefill_seconds_per_block, 0);
  (*store)->NotePrefill(0.02);
  EXPECT_DOUBLE_EQ((*store)->stats().prefill_seconds_per_block, 0.02);
  (*store)->NotePrefill(0.04);  // a recent mean
  EXPECT_GT((*store)->stats().prefill_seconds_per_block, 0.02);
  EXPECT_LT((*store)->stats().prefill_seconds_per_block, 0.04);
}

TEST(KvTierStoreTest, FullQueueDropsInsteadOfBlocking) {
  ScratchDir dir;
  KvTierOptions o;
  o.disk_dir = dir.path();
  o.fingerprint = 9;
  const auto chain = Chain(50, 0, 4096);
  o.write_queue_bytes = 3 * chain[0]->size_bytes();
  o.write_bytes_per_second = 4096;  // one block a second: the queue stays full
  auto store = KvTierStore::Create(o);
  ASSERT_TRUE(store.ok());
  const absl::Time start = absl::Now();
  for (const auto& b : chain) {
    if ((*store)->ShouldOffer(b->hash)) (*store)->Offer(b);
  }
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  const KvTierStats s = (*store)->stats();
  EXPECT_GE(s.write_drops, 45);
  EXPECT_LE(s.write_queue_blocks, 3);
  EXPECT_GT(s.write_queue_bytes, 0);
}

// The host tier's KV events.
class HostListener : public KvTierListener {
 public:
  void OnTierStored(KvTier tier, BlockHash hash) override {
    if (tier == KvTier::kHost) held.insert(hash);
  }
  void OnTierRemoved(KvTier tier, BlockHash hash) override {
    if (tier == KvTier::kHost) held.erase(hash);
  }
  std::set<BlockHash> held;
};

TEST(KvTierStoreTest, HostTierServesFirstAndIsLru) {
  KvTierOptions o;
  HostListener listener;
  o.listener = &listener;
  const auto chain = Chain(4, 0, 1000);
  o.host_bytes = 3 * chain[0]->size_bytes();
  auto store = KvTierStore::Create(o);
  ASSERT_TRUE(store.ok());
  for (const auto& b : chain) {
    ASSERT_TRUE((*store)->ShouldOffer(b->hash));
    (*store)->Offer(b);
  }
  // Block 0 was evicted by block 3.
  EXPECT_EQ((*store)->Probe(Hashes(chain)), 0);
  EXPECT_EQ(listener.held, (std::set<BlockHash>{chain[1]->hash, chain[2]->hash, chain[3]->hash}));
  std::vector<BlockHash> tail = {chain[1]->hash, chain[2]->hash, chain[3]->hash};
  EXPECT_EQ((*store)->Probe(tail), 3);
  (*store)->StartLoad(tail);
  auto loads = WaitForLoads(store->get(), 1);
  ASSERT_EQ(loads.size(), 1u);
  ASSERT_EQ(loads[0].blocks.size(), 3u);
  EXPECT_EQ(loads[0].blocks[0].get(), chain[1].get());  // shared, not copied
  const KvTierStats s = (*store)->stats();
  EXPECT_EQ(s.tier[0].hits, 3);
  EXPECT_EQ(s.tier[0].evictions, 1);
  EXPECT_FALSE(s.tier[1].enabled);
}

TEST(KvTierStoreTest, CancelledLoadNeverComesBack) {
  KvTierOptions o;
  const auto chain = Chain(3);
  o.host_bytes = 1 << 20;
  auto store = KvTierStore::Create(o);
  ASSERT_TRUE(store.ok());
  for (const auto& b : chain) (*store)->Offer(b);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back((*store)->StartLoad(Hashes(chain)));
  for (int i = 0; i < 20; i += 2) (*store)->CancelLoad(ids[i]);
  auto loads = WaitForLoads(store->get(), 10);
  absl::SleepFor(absl::Milliseconds(50));
  for (TierLoad& l : (*store)->TakeCompleted()) loads.push_back(std::move(l));
  ASSERT_EQ(loads.size(), 10u);
  for (const TierLoad& l : loads) EXPECT_EQ(l.id % 2, 0u) << l.id;  // ids 2, 4, ... kept
  EXPECT_EQ((*store)->stats().loads_in_flight, 0);
}

}  // namespace
}  // namespace tandem
