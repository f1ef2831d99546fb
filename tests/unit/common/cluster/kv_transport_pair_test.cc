// The KV transport of a prefill/decode pair, from what each advertises: cuda-ipc on one GPU, nccl
// across GPUs (NCCL refuses two ranks on one GPU), tcp between host-memory workers; pairs that
// share no usable transport are refused naming both sides and why.

#include "common/cluster/kv_transport_pair.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

KvTransportPeer Prefill(std::string transport, std::string gpu = "") {
  return {"prefill", "10.0.0.1:50061", std::move(transport), std::move(gpu)};
}
KvTransportPeer Decode(std::string transport, std::string gpu = "") {
  return {"decode", "10.0.0.2:50061", std::move(transport), std::move(gpu)};
}

std::string Pair(const KvTransportPeer& s, const KvTransportPeer& r) {
  absl::StatusOr<std::string> t = PairKvTransport(s, r);
  return t.ok() ? *t : "refused: " + std::string(t.status().message());
}

TEST(KvTransportPairTest, SpokenTransports) {
  EXPECT_EQ(SpokenKvTransports(""), std::vector<std::string>{"tcp"});
  EXPECT_EQ(SpokenKvTransports("nccl"), std::vector<std::string>{"nccl"});
  EXPECT_EQ(SpokenKvTransports("nccl,cuda-ipc"), (std::vector<std::string>{"nccl", "cuda-ipc"}));
}

TEST(KvTransportPairTest, AutoOnBothSidesPicksByGpu) {
  const std::string both = "nccl,cuda-ipc";
  EXPECT_EQ(Pair(Prefill(both, "GPU-a"), Decode(both, "GPU-a")), "cuda-ipc");
  EXPECT_EQ(Pair(Prefill(both, "GPU-a"), Decode(both, "GPU-b")), "nccl");
  // One side fixed: the other follows if it can.
  EXPECT_EQ(Pair(Prefill(both, "GPU-a"), Decode("nccl", "GPU-b")), "nccl");
  EXPECT_EQ(Pair(Prefill("cuda-ipc", "GPU-a"), Decode(both, "GPU-a")), "cuda-ipc");
}

TEST(KvTransportPairTest, HostMemory) {
  EXPECT_EQ(Pair(Prefill("tcp"), Decode("tcp")), "tcp");
  EXPECT_EQ(Pair(Prefill(""), Decode("tcp")), "tcp");  // workers that predate the field
}

TEST(KvTransportPairTest, RefusalsNameBothSidesAndWhy) {
  const std::string ipc_apart = Pair(Prefill("cuda-ipc", "GPU-a"), Decode("cuda-ipc", "GPU-b"));
  EXPECT_NE(ipc_apart.find("refused: KV transport mismatch"), std::string::npos) << ipc_apart;
  EXPECT_NE(ipc_apart.find("one GPU"), std::string::npos) << ipc_apart;
  EXPECT_NE(ipc_apart.find("GPU-a"), std::string::npos) << ipc_apart;
  EXPECT_NE(ipc_apart.find("GPU-b"), std::string::npos) << ipc_apart;
  EXPECT_NE(ipc_apart.find("10.0.0.1:50061"), std::string::npos) << ipc_apart;
  EXPECT_NE(ipc_apart.find("10.0.0.2:50061"), std::string::npos) << ipc_apart;

  const std::string nccl_together = Pair(Prefill("nccl", "GPU-a"), Decode("nccl", "GPU-a"));
  EXPECT_NE(nccl_together.find("different GPUs"), std::string::npos) << nccl_together;
  // auto cannot rescue a fixed nccl peer on its own GPU either.
  EXPECT_NE(Pair(Prefill("nccl,cuda-ipc", "GPU-a"), Decode("nccl", "GPU-a")).find("refused"),
            std::string::npos);

  const std::string disjoint = Pair(Prefill("tcp"), Decode("nccl", "GPU-a"));
  EXPECT_NE(disjoint.find("share no transport"), std::string::npos) << disjoint;
  EXPECT_NE(disjoint.find("'tcp'"), std::string::npos) << disjoint;
  EXPECT_NE(disjoint.find("'nccl'"), std::string::npos) << disjoint;
}

}  // namespace
}  // namespace tandem
