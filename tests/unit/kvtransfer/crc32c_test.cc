#include "kvtransfer/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32cPortable(0, "123456789", 9), 0xe3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  // RFC 3720 (iSCSI) B.4 test vectors.
  EXPECT_EQ(Crc32c(0, zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(Crc32c(0, ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(0, inc.data(), 32), 0x46dd794eu);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32cTest, HardwareMatchesPortableOnEverySizeAndAlignment) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> buf(3 * 8192 * 2 + 1000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t sizes[] = {0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 8191, 24575, 24576, 24577, 49152};
  for (size_t size : sizes) {
    for (size_t offset = 0; offset < 9; ++offset) {
      ASSERT_EQ(Crc32c(0x1234, buf.data() + offset, size),
                Crc32cPortable(0x1234, buf.data() + offset, size))
          << size << " @" << offset;
    }
  }
}

TEST(Crc32cTest, ChainingEqualsOneShot) {
  std::string s(100000, '\0');
  std::mt19937 rng(5);
  for (auto& c : s) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(0, s.data(), s.size());
  uint32_t chained = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t n = std::min<size_t>(s.size() - pos, 1 + rng() % 30000);
    chained = Crc32c(chained, s.data() + pos, n);
    pos += n;
  }
  EXPECT_EQ(chained, whole);
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> buf(1024);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 31);
  const uint32_t good = Crc32c(0, buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); i += 13) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<uint8_t>(1 << bit);
      ASSERT_NE(Crc32c(0, buf.data(), buf.size()), good);
      buf[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
