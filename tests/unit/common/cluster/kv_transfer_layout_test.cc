// The one KV layout type: region sizes, the compatibility check the KV transport and the router
// share, validation and KV dtype names.

#include "common/cluster/kv_transfer_layout.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/unit/common/cluster/kv_layout_test_util.h"

namespace tandem {
namespace {

TEST(KvTransferLayoutTest, RegionBytesMatchesTheBackendLayout) {
  KvLayout l = testing::SmallKvLayout();
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
  EXPECT_EQ(l.region_bytes(), KvRegionBytes(12, 16, 64, DType::kI8));
}

TEST(KvTransferLayoutTest, CheckNamesTheFirstDifferingFieldWithBothValues) {
  const KvLayout a = testing::SmallKvLayout();
  EXPECT_TRUE(CheckKvLayoutCompatible(a, a).ok());
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
    absl::Status s = CheckKvLayoutCompatible(a, b);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
  KvLayout b = a;
  b.num_kv_heads = 4;
  EXPECT_EQ(CheckKvLayoutCompatible(a, b).message(),
            "kv layout mismatch in num_kv_heads: local 2, peer 4");
  b = a;
  b.kv_dtype = DType::kF32;
  EXPECT_EQ(CheckKvLayoutCompatible(a, b).message(),
            "kv layout mismatch in kv_dtype: local bf16, peer f32");
  // The protocol version is compared first: other fields may mean other things under another.
  b.protocol_version = a.protocol_version + 1;
  EXPECT_NE(CheckKvLayoutCompatible(a, b).message().find("protocol_version"), std::string::npos);
}

TEST(KvTransferLayoutTest, Validate) {
  EXPECT_TRUE(ValidateKvLayout(testing::SmallKvLayout()).ok());
  KvLayout l = testing::SmallKvLayout();
  l.head_dim = 0;
  EXPECT_EQ(ValidateKvLayout(l).code(), absl::StatusCode::kInvalidArgument);
  for (DType kv : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    l = testing::SmallKvLayout();
    l.kv_dtype = kv;
    EXPECT_TRUE(ValidateKvLayout(l).ok()) << DTypeName(kv);
  }
  l.kv_dtype = DType::kI64;
  EXPECT_EQ(ValidateKvLayout(l).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(KvLayoutDebugString(testing::SmallKvLayout()).find("num_kv_heads=2"),
            std::string::npos);
}

TEST(KvTransferLayoutTest, KvDTypeNamesRoundTrip) {
  for (DType kv : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    absl::StatusOr<DType> parsed = ParseKvDType(DTypeName(kv));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kv);
  }
  EXPECT_EQ(ParseKvDType("i64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvDType("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
