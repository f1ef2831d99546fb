// The router refuses at registration a worker whose KV transport cannot talk to the cluster's
// (every prefill worker sends to every decode worker), naming both sides; workers that agree
// are admitted.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/worker_registry.h"
#include "tests/unit/router/fake_registry_worker.h"

namespace tandem {
namespace {

using Server = FakeRegistryWorkerServer;

TEST(WorkerRegistryTransportTest, RefusesAMismatchNamingBothSides) {
  Server decode("decode", "nccl");
  Server prefill("prefill", "tcp");
  RegistryOptions o2;
  o2.decode_addresses = {decode.address};
  o2.prefill_addresses = {prefill.address};
  o2.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry both(o2);
  both.Start();
  ASSERT_TRUE(Eventually([&] { return !both.refused().empty(); }));
  const std::string refusal = both.refused().front();
  // Whichever registered second is refused; both transports and both addresses are named.
  EXPECT_NE(refusal.find("KV transport mismatch"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("'nccl'"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("'tcp'"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find(decode.address), std::string::npos) << refusal;
  EXPECT_NE(refusal.find(prefill.address), std::string::npos) << refusal;
  EXPECT_EQ(both.All().size(), 1u);
  both.Stop();
}

TEST(WorkerRegistryTransportTest, AdmitsWorkersThatAgree) {
  Server decode("decode", "nccl");
  Server prefill("prefill", "nccl");
  RegistryOptions o;
  o.decode_addresses = {decode.address};
  o.prefill_addresses = {prefill.address};
  o.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry registry(o);
  registry.Start();
  EXPECT_TRUE(registry.WaitForWorkers(1, 1, absl::Seconds(10)));
  EXPECT_TRUE(registry.refused().empty());
  registry.Stop();
}

// cuda-ipc maps one worker's KV pool into another process on the same GPU: workers on two GPUs
// are refused, naming both GPUs; workers on one are admitted.
TEST(WorkerRegistryTransportTest, CudaIpcNeedsOneGpu) {
  Server decode("decode", "cuda-ipc", "GPU-aaaa");
  Server prefill("prefill", "cuda-ipc", "GPU-bbbb");
  Server same("prefill", "cuda-ipc", "GPU-aaaa");
  RegistryOptions o;
  o.decode_addresses = {decode.address};
  o.prefill_addresses = {prefill.address};
  o.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry registry(o);
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return !registry.refused().empty(); }));
  const std::string refusal = registry.refused().front();
  EXPECT_NE(refusal.find("one GPU"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("GPU-aaaa"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("GPU-bbbb"), std::string::npos) << refusal;
  EXPECT_EQ(registry.All().size(), 1u);
  registry.Stop();

  RegistryOptions o2 = o;
  o2.prefill_addresses = {same.address};
  WorkerRegistry agree(o2);
  agree.Start();
  EXPECT_TRUE(agree.WaitForWorkers(1, 1, absl::Seconds(10)));
  EXPECT_TRUE(agree.refused().empty());
  agree.Stop();
}

}  // namespace
}  // namespace tandem
