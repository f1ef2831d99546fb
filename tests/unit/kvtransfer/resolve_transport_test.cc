// --kv-transport is settled at a worker's startup: what each value resolves to on the CPU and on
// a GPU, and the one-line refusals of what the process cannot run.

#include <string>

#include "gtest/gtest.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {
namespace {

void ExpectRefused(const std::string& requested, const std::string& device, absl::StatusCode code,
                   const std::string& words) {
  absl::StatusOr<std::string> r = ResolveTransport(requested, device);
  ASSERT_FALSE(r.ok()) << requested << " on " << device << " resolved to " << *r;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << "one line: " << r.status();
}

TEST(ResolveTransportTest, OnTheCpu) {
  EXPECT_EQ(*ResolveTransport("tcp", "cpu"), "tcp");
  EXPECT_EQ(*ResolveTransport("auto", "cpu"), "tcp");
  EXPECT_EQ(*ResolveTransport("loopback", "cpu"), "loopback");
  // nccl moves GPU memory: refused on the CPU, whatever is missing first (NCCL in this build, a
  // usable GPU, or the engine on it).
  ExpectRefused("nccl", "cpu", absl::StatusCode::kFailedPrecondition, "--kv-transport nccl");
}

TEST(ResolveTransportTest, OnAGpu) {
  ExpectRefused("tcp", "cuda:0", absl::StatusCode::kFailedPrecondition, "host memory");
  // auto on a GPU speaks every device transport of the build (the router picks per pair).
  absl::StatusOr<std::string> automatic = ResolveTransport("auto", "cuda:0");
  if (!CudaIpcBuilt()) {
    EXPECT_EQ(automatic.status().code(), absl::StatusCode::kFailedPrecondition);
  } else if (automatic.ok()) {
    EXPECT_EQ(*automatic, NcclBuilt() ? "nccl,cuda-ipc" : "cuda-ipc");
  }
}

TEST(ResolveTransportTest, SeveralDeviceTransports) {
  ExpectRefused("nccl,tcp", "cuda:0", absl::StatusCode::kInvalidArgument, "only nccl and cuda-ipc");
  if (!NcclBuilt()) {
    ExpectRefused("nccl,cuda-ipc", "cuda:0", absl::StatusCode::kFailedPrecondition, "nccl");
  }
  EXPECT_TRUE(UsesControlChannel("nccl,cuda-ipc"));
  EXPECT_FALSE(UsesControlChannel("nccl,tcp"));
}

TEST(ResolveTransportTest, CudaIpc) {
  // cuda-ipc moves GPU memory between processes on one GPU: refused on the CPU, naming what is
  // missing (CUDA in this build, or the engine on the GPU).
  ExpectRefused("cuda-ipc", "cpu", absl::StatusCode::kFailedPrecondition,
                CudaIpcBuilt() ? "--device cuda" : "build with CUDA");
  if (!CudaIpcBuilt()) {
    ExpectRefused("cuda-ipc", "cuda:0", absl::StatusCode::kFailedPrecondition, "build with CUDA");
  }
  // A cluster whose workers all share the engine's device (tandem serve): auto is cuda-ipc on a
  // GPU, tcp on the CPU.
  EXPECT_EQ(*ResolveSharedGpuTransport("auto", "cpu"), "tcp");
  EXPECT_EQ(*ResolveSharedGpuTransport("tcp", "cpu"), "tcp");
  absl::StatusOr<std::string> shared = ResolveSharedGpuTransport("auto", "cuda:0");
  if (CudaIpcBuilt() && shared.ok()) EXPECT_EQ(*shared, "cuda-ipc");
  if (!CudaIpcBuilt()) EXPECT_FALSE(shared.ok());
  EXPECT_TRUE(UsesControlChannel("cuda-ipc"));
  EXPECT_TRUE(UsesControlChannel("nccl"));
  EXPECT_FALSE(UsesControlChannel("tcp"));
}

TEST(ResolveTransportTest, Unknown) {
  ExpectRefused("rdma", "cpu", absl::StatusCode::kInvalidArgument, "'rdma'");
}

}  // namespace
}  // namespace tandem::kvtransfer
