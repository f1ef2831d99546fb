// The router reads a worker's v1::KvLayoutInfo as the one KV layout type and refuses exactly the
// workers the KV transport's handshake would refuse, in the same words.

#include <string>

#include "common/cluster/kv_transfer_layout.h"
#include "common/cluster/proto/cluster_proto.h"
#include "gtest/gtest.h"
#include "router/worker_registry.h"
#include "tests/unit/common/cluster/kv_layout_test_util.h"

namespace tandem {
namespace {

TEST(WorkerRegistryLayoutTest, ReadsEveryFieldOfTheWorkersLayout) {
  for (DType kv : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    KvLayout l = testing::SmallKvLayout();
    l.kv_dtype = kv;
    absl::StatusOr<KvLayout> read = KvLayoutFromInfo(KvLayoutToInfo(l));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->model_id, l.model_id);
    EXPECT_EQ(read->num_layers, l.num_layers);
    EXPECT_EQ(read->num_kv_heads, l.num_kv_heads);
    EXPECT_EQ(read->head_dim, l.head_dim);
    EXPECT_EQ(read->block_size, l.block_size);
    EXPECT_EQ(read->kv_dtype, kv);
    EXPECT_EQ(read->protocol_version, kKvTransferProtocolVersion);
    EXPECT_TRUE(CheckKvLayoutCompatible(l, *read).ok());
  }
}

TEST(WorkerRegistryLayoutTest, AnUnknownKvDtypeIsRefused) {
  v1::KvLayoutInfo info = KvLayoutToInfo(testing::SmallKvLayout());
  info.set_kv_dtype("fp9");
  absl::StatusOr<KvLayout> read = KvLayoutFromInfo(info);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("fp9"), std::string::npos) << read.status();
}

TEST(WorkerRegistryLayoutTest, RefusesWhatTheTransportRefusesInTheSameWords) {
  const KvLayout cluster = testing::SmallKvLayout();
  struct Case {
    const char* field;
    void (*mutate)(KvLayout*);
  };
  const Case cases[] = {
      {"model_id", [](KvLayout* l) { l->model_id = "other-model"; }},
      {"num_layers", [](KvLayout* l) { l->num_layers = 6; }},
      {"num_kv_heads", [](KvLayout* l) { l->num_kv_heads = 4; }},
      {"head_dim", [](KvLayout* l) { l->head_dim = 16; }},
      {"block_size", [](KvLayout* l) { l->block_size = 16; }},
      {"kv_dtype", [](KvLayout* l) { l->kv_dtype = DType::kF8E4M3; }},
      {"protocol_version", [](KvLayout* l) { l->protocol_version += 1; }},
  };
  for (const Case& c : cases) {
    KvLayout worker = cluster;
    c.mutate(&worker);
    absl::StatusOr<KvLayout> read = KvLayoutFromInfo(KvLayoutToInfo(worker));
    ASSERT_TRUE(read.ok()) << read.status();
    const absl::Status router = CheckKvLayoutCompatible(cluster, *read);
    const absl::Status transport = CheckKvLayoutCompatible(cluster, worker);
    EXPECT_EQ(router.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_EQ(router, transport) << c.field;
    EXPECT_NE(router.message().find(c.field), std::string::npos) << router;
  }
}

}  // namespace
}  // namespace tandem
