// The block file form: a round trip is exact, and every single flipped byte, a truncation, another
// fingerprint or another name is DATA_LOSS (a miss, never wrong KV).
#include "common/engine/kv/tiers/tier_block.h"

#include <gtest/gtest.h>

#include "tests/unit/common/engine/kv/tiers/tier_test_util.h"

namespace tandem {
namespace {

using tier_testing::Chain;

TEST(TierBlockTest, RoundTripIsExact) {
  const auto chain = Chain(2, 5, 1000);
  const TierBlock& b = *chain[1];
  const std::vector<uint8_t> bytes = EncodeTierBlock(b, 42);
  auto back = DecodeTierBlock(bytes, 42, b.hash);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hash, b.hash);
  EXPECT_EQ(back->parent, b.parent);
  EXPECT_EQ(back->salt, b.salt);
  EXPECT_EQ(back->tokens, b.tokens);
  EXPECT_EQ(back->payload, b.payload);
}

TEST(TierBlockTest, EveryFlippedByteIsDetected) {
  const auto chain = Chain(1, 0, 200);
  const std::vector<uint8_t> bytes = EncodeTierBlock(*chain[0], 42);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80}) {
      std::vector<uint8_t> bad = bytes;
      bad[i] ^= mask;
      auto r = DecodeTierBlock(bad, 42, chain[0]->hash);
      ASSERT_FALSE(r.ok()) << "byte " << i;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    }
  }
}

TEST(TierBlockTest, TornWrongFingerprintOrNameIsDataLoss) {
  const auto chain = Chain(2, 0, 200);
  const std::vector<uint8_t> bytes = EncodeTierBlock(*chain[0], 42);
  for (size_t n : {size_t{0}, size_t{10}, size_t{63}, size_t{64}, bytes.size() - 1}) {
    std::vector<uint8_t> torn(bytes.begin(), bytes.begin() + n);
    EXPECT_EQ(DecodeTierBlock(torn, 42, chain[0]->hash).status().code(),
              absl::StatusCode::kDataLoss);
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(DecodeTierBlock(longer, 42, chain[0]->hash).ok());
  EXPECT_FALSE(DecodeTierBlock(bytes, 43, chain[0]->hash).ok());
  EXPECT_FALSE(DecodeTierBlock(bytes, 42, chain[1]->hash).ok());
}

TEST(TierBlockTest, IdentityMustHashToItsName) {
  // A well-formed file (valid checksum) whose tokens do not hash to its name: refused.
  auto chain = Chain(1, 0, 64);
  TierBlock forged;
  forged.hash = chain[0]->hash;
  forged.parent = chain[0]->parent;
  forged.salt = chain[0]->salt;
  forged.tokens = chain[0]->tokens;
  forged.tokens[0] += 1;
  forged.payload = TierPayload(64);
  const std::vector<uint8_t> bytes = EncodeTierBlock(forged, 42);
  EXPECT_EQ(DecodeTierBlock(bytes, 42, forged.hash).status().code(), absl::StatusCode::kDataLoss);
}

TEST(TierBlockTest, ChecksumDependsOnEveryByteAndSeed) {
  std::vector<uint8_t> a(100, 3);
  const uint64_t base = TierChecksum(a);
  EXPECT_NE(TierChecksum(a, 1), base);
  a[99] = 4;
  EXPECT_NE(TierChecksum(a), base);
}

}  // namespace
}  // namespace tandem
