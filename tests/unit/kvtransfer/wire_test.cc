// The TCP wire format's encoding.

#include "kvtransfer/tcp/wire.h"

#include "gtest/gtest.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

TEST(WireTest, MessagesRoundTrip) {
  wire::Hello hello;
  hello.layout = testing::SmallLayout();
  wire::Hello hello2;
  ASSERT_TRUE(wire::DecodeHello(wire::EncodeHello(hello), &hello2).ok());
  EXPECT_TRUE(CheckKvLayoutCompatible(hello.layout, hello2.layout).ok());
  EXPECT_EQ(hello2.magic, wire::kHelloMagic);

  wire::Begin b{7, 3, 99, 1500, {4, 5, 6}};
  wire::Begin b2;
  ASSERT_TRUE(wire::DecodeBegin(wire::EncodeBegin(b), &b2).ok());
  EXPECT_EQ(b2.transfer_id, 7u);
  EXPECT_EQ(b2.attempt, 3u);
  EXPECT_EQ(b2.incarnation, 99u);
  EXPECT_EQ(b2.deadline_ms, 1500);
  EXPECT_EQ(b2.dst_blocks, (std::vector<int32_t>{4, 5, 6}));

  wire::Finish f{7, 3, 10, 4096, std::string("\0tr", 3)};
  wire::Finish f2;
  ASSERT_TRUE(wire::DecodeFinish(wire::EncodeFinish(f), &f2).ok());
  EXPECT_EQ(f2.trailer, std::string("\0tr", 3));
  EXPECT_EQ(f2.bytes, 4096u);

  wire::Outcome o{7, 3, absl::DataLossError("bad")};
  wire::Outcome o2;
  ASSERT_TRUE(wire::DecodeOutcome(wire::EncodeOutcome(o), &o2).ok());
  EXPECT_EQ(o2.status, o.status);
}

TEST(WireTest, TruncatedOrCorruptMessagesAreRejected) {
  const std::string meta = wire::EncodeBegin({7, 3, 99, -1, {4, 5, 6}});
  wire::Begin b;
  for (size_t n = 0; n < meta.size(); ++n) {
    EXPECT_FALSE(wire::DecodeBegin(meta.substr(0, n), &b).ok()) << n;
  }
  EXPECT_FALSE(wire::DecodeBegin(meta + "x", &b).ok());
  std::string frame = wire::MakeFrame(wire::FrameType::kBegin, 0, meta);
  auto prefix = wire::DecodePrefix(reinterpret_cast<const uint8_t*>(frame.data()));
  ASSERT_TRUE(prefix.ok());
  EXPECT_TRUE(wire::VerifyMeta(*prefix, frame.substr(wire::kPrefixBytes)).ok());
  frame[wire::kPrefixBytes + 3] ^= 1;
  EXPECT_EQ(wire::VerifyMeta(*prefix, frame.substr(wire::kPrefixBytes)).code(),
            absl::StatusCode::kDataLoss);
  frame[0] ^= 1;
  EXPECT_FALSE(wire::DecodePrefix(reinterpret_cast<const uint8_t*>(frame.data())).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer
