// The host tier in an arena (the page-locked memory of a GPU worker; plain memory here): slots come
// back only once every holder of their block let go, the tier evicts a block nothing else holds to
// free a slot and never one a load or copy still holds, keeps only blocks in its slots, and a disk
// read lands in a slot.
#include "common/engine/kv/tiers/host_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/engine/kv/tiers/host_tier.h"
#include "common/engine/kv/tiers/tier_store.h"
#include "tests/unit/common/engine/kv/tiers/tier_test_util.h"

namespace tandem {
namespace {

using tier_testing::Chain;
using tier_testing::ScratchDir;

constexpr size_t kBytes = 1000;  // a block's payload; slots are 1024 apart

std::shared_ptr<HostArena> Arena(int slots, bool pinned = false) {
  const size_t bytes = slots * 1024;
  std::shared_ptr<uint8_t> memory(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  return HostArena::Create(memory, bytes, kBytes, pinned);
}

// `chain[i]` copied into a slot of `tier`.
std::shared_ptr<TierBlock> InSlot(HostTier& tier, const TierBlock& b) {
  auto out = std::make_shared<TierBlock>();
  out->hash = b.hash;
  out->parent = b.parent;
  out->salt = b.salt;
  out->tokens = b.tokens;
  out->payload = tier.TakeSlot(b.payload.size());
  if (out->payload.empty()) return nullptr;
  std::memcpy(out->payload.data(), b.payload.data(), b.payload.size());
  return out;
}

TEST(HostArenaTest, ASlotComesBackWithItsLastHolder) {
  auto arena = Arena(2);
  EXPECT_EQ(arena->slots(), 2);
  TierPayload a = arena->Take();
  TierPayload b = arena->Take();
  ASSERT_EQ(a.size(), kBytes);
  EXPECT_TRUE(a.in_arena());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) - reinterpret_cast<uintptr_t>(a.data()), 1024u);
  EXPECT_TRUE(arena->Take().empty());
  auto block = std::make_shared<TierBlock>();
  block->payload = std::move(a);
  TierBlockPtr reader = block;  // e.g. a load, or a copy in flight
  block.reset();
  EXPECT_EQ(arena->free_slots(), 0);
  reader.reset();
  EXPECT_EQ(arena->free_slots(), 1);
  EXPECT_FALSE(arena->Take().empty());
}

TEST(HostArenaTest, TheTierFreesSlotsOnlyFromBlocksNothingElseHolds) {
  const auto chain = Chain(4, 0, kBytes);
  HostTier tier(1 << 20, nullptr, Arena(2, /*pinned=*/true));
  EXPECT_EQ(tier.counters().pinned_bytes, 2048);
  tier.Put(chain[0]);  // heap memory: not kept in an arena tier
  EXPECT_FALSE(tier.Contains(chain[0]->hash));
  auto b0 = InSlot(tier, *chain[0]);
  auto b1 = InSlot(tier, *chain[1]);
  ASSERT_TRUE(b0 && b1);
  tier.Put(b0);
  tier.Put(b1);
  TierBlockPtr held = tier.Get(chain[0]->hash);  // a load holds block 0
  b0.reset();
  b1.reset();
  tier.Touch(chain[1]->hash);  // block 0 is the least recently used
  // Block 0 is held: block 1 is evicted for the new slot, though more recently used.
  auto b2 = InSlot(tier, *chain[2]);
  ASSERT_NE(b2, nullptr);
  EXPECT_TRUE(tier.Contains(chain[0]->hash));
  EXPECT_FALSE(tier.Contains(chain[1]->hash));
  EXPECT_EQ(tier.counters().evictions, 1);
  // Every slot held elsewhere now (block 0 by the load, block 2 not offered yet): none to give.
  EXPECT_TRUE(tier.TakeSlot(kBytes).empty());
  EXPECT_TRUE(tier.TakeSlot(kBytes + 1).empty());             // another size: never
  EXPECT_EQ(held->payload.span(), chain[0]->payload.span());  // untouched
  held.reset();
  auto b3 = InSlot(tier, *chain[3]);
  ASSERT_NE(b3, nullptr);
  EXPECT_FALSE(tier.Contains(chain[0]->hash));
}

TEST(HostArenaTest, ADiskReadLandsInAHostTierSlot) {
  ScratchDir dir;
  const auto chain = Chain(2, 0, kBytes);
  KvTierOptions o;
  o.host_bytes = 1 << 20;
  o.disk_dir = dir.path();
  o.fingerprint = 3;
  auto store = KvTierStore::Create(o, Arena(4));
  ASSERT_TRUE(store.ok()) << store.status();
  for (const auto& b : chain) (*store)->Offer(b);  // heap blocks: the disk tier only
  ASSERT_TRUE((*store)->Flush(absl::Seconds(10)));
  EXPECT_EQ((*store)->stats().tier[0].blocks, 0);
  (*store)->StartLoad({chain[0]->hash, chain[1]->hash});
  std::vector<TierLoad> loads;
  for (int i = 0; i < 5000 && loads.empty(); ++i) {
    loads = (*store)->TakeCompleted();
    if (loads.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(loads.size(), 1u);
  ASSERT_EQ(loads[0].blocks.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(loads[0].blocks[i]->payload.in_arena());
    EXPECT_EQ(loads[0].blocks[i]->payload, chain[i]->payload);
  }
  EXPECT_EQ((*store)->stats().tier[0].blocks, 2);        // promoted
  EXPECT_EQ((*store)->stats().tier[0].pinned_bytes, 0);  // plain memory
}

}  // namespace
}  // namespace tandem
