// CheckCompatible and the TCP wire format's encoding.

#include "kvtransfer/layout.h"
#include "gtest/gtest.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

TEST(LayoutTest, RegionBytesMatchesTheBackendLayout) {
  KvLayout l = testing::SmallLayout();
  EXPECT_EQ(l.region_bytes(), 256u);
  l.num_layers = 12;
  l.num_kv_heads = 12;
  l.head_dim = 64;
  l.block_size = 16;
  EXPECT_EQ(l.region_bytes(), 48u << 10);  // llama-110m-like, bf16
  // Quantized KV: one byte per element plus an f32 scale per (K/V, head, token) row.
  l.kv_dtype = DType::kF8E4M3;
  EXPECT_EQ(l.region_bytes(), 24u * 1024 + 2 * 12 * 16 * 4);
  l.kv_dtype = DType::kI8;
  EXPECT_EQ(l.region_bytes(), 24u * 1024 + 2 * 12 * 16 * 4);
}

TEST(LayoutTest, CheckCompatibleNamesTheFirstDifferingField) {
  const KvLayout a = testing::SmallLayout();
  EXPECT_TRUE(CheckCompatible(a, a).ok());
  struct Case {
    const char* field;
    void (*mutate)(KvLayout*);
  };
  const Case cases[] = {
      {"model_id", [](KvLayout* l) { l->model_id += "-other"; }},
      {"num_layers", [](KvLayout* l) { l->num_layers += 1; }},
      {"num_kv_heads", [](KvLayout* l) { l->num_kv_heads += 1; }},
      {"head_dim", [](KvLayout* l) { l->head_dim += 1; }},
      {"block_size", [](KvLayout* l) { l->block_size += 1; }},
      {"kv_dtype", [](KvLayout* l) { l->kv_dtype = DType::kF8E4M3; }},
      {"protocol_version", [](KvLayout* l) { l->protocol_version += 1; }},
  };
  for (const Case& c : cases) {
    KvLayout b = a;
    c.mutate(&b);
    absl::Status s = CheckCompatible(a, b);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
  KvLayout b = a;
  b.kv_dtype = DType::kF32;
  EXPECT_NE(CheckCompatible(a, b).message().find("bf16"), std::string::npos);
  EXPECT_NE(CheckCompatible(a, b).message().find("f32"), std::string::npos);
}

TEST(LayoutTest, ValidateLayout) {
  EXPECT_TRUE(ValidateLayout(testing::SmallLayout()).ok());
  KvLayout l = testing::SmallLayout();
  l.head_dim = 0;
  EXPECT_EQ(ValidateLayout(l).code(), absl::StatusCode::kInvalidArgument);
  for (DType kv : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    l = testing::SmallLayout();
    l.kv_dtype = kv;
    EXPECT_TRUE(ValidateLayout(l).ok()) << DTypeName(kv);
  }
  l.kv_dtype = DType::kI64;
  EXPECT_EQ(ValidateLayout(l).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, MessagesRoundTrip) {
  wire::Hello hello;
  hello.layout = testing::SmallLayout();
  wire::Hello hello2;
  ASSERT_TRUE(wire::DecodeHello(wire::EncodeHello(hello), &hello2).ok());
  EXPECT_TRUE(CheckCompatible(hello.layout, hello2.layout).ok());
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
