// The NCCL transport. Labelled gpu: skipped without a CUDA device; the cases that move data
// need two devices (NCCL refuses two ranks of one communicator on the same GPU).

#include "gtest/gtest.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

#if TANDEM_HAVE_NCCL
#include "common/cuda/cuda_api.h"
#endif

namespace tandem::kvtransfer {
namespace {

#if TANDEM_HAVE_NCCL

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A KV pool in device memory: [layer][block] regions.
class DevicePool : public KvRegionAccess {
 public:
  DevicePool(const KvLayout& l, int64_t blocks, int device)
      : region_(l.region_bytes()), blocks_(blocks), layers_(l.num_layers) {
    cudaSetDevice(device);
    cudaMalloc(&base_, region_ * blocks * l.num_layers);
    cudaMemset(base_, 0, region_ * blocks * l.num_layers);
  }
  ~DevicePool() override { cudaFree(base_); }
  uint8_t* Region(int64_t layer, int32_t block) override {
    return base_ + (layer * blocks_ + block) * region_;
  }
  int64_t num_blocks() const override { return blocks_; }
  void Fill(uint8_t seed) {
    std::vector<uint8_t> host(region_ * blocks_ * layers_);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + seed);
    cudaMemcpy(base_, host.data(), host.size(), cudaMemcpyHostToDevice);
  }
  std::vector<uint8_t> Read(int64_t layer, int32_t block) {
    std::vector<uint8_t> out(region_);
    cudaMemcpy(out.data(), Region(layer, block), region_, cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  size_t region_;
  int64_t blocks_, layers_;
  uint8_t* base_ = nullptr;
};

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
    layout_ = testing::SmallLayout();
  }
  // Receiver on device `rdev`; a sender whose control channel calls it directly.
  void Start(int sender_device, int receiver_device, const KvLayout& sender_layout) {
    dst_ = std::make_unique<DevicePool>(layout_, 32, receiver_device);
    src_ = std::make_unique<DevicePool>(sender_layout, 32, sender_device);
    ReceiverOptions ro;
    ro.transport = "nccl";
    ro.layout = layout_;
    ro.cuda_device = receiver_device;
    auto r = CreateReceiver(ro, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
    SenderOptions so;
    so.transport = "nccl";
    so.layout = sender_layout;
    so.cuda_device = sender_device;
    so.max_communicators = 2;
    so.control_channel = [this](const std::string& endpoint, const std::string& request) {
      EXPECT_EQ(endpoint, receiver_->endpoint());
      return receiver_->HandleControl(request);
    };
    auto s = CreateSender(so, src_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
  }
  TransferTarget Target(uint64_t id, std::vector<int32_t> dst, uint32_t attempt = 0) {
    TransferTarget t{receiver_->endpoint(), receiver_->incarnation(), id, attempt, std::move(dst)};
    t.deadline = absl::Now() + absl::Seconds(20);
    return t;
  }

  KvLayout layout_;
  std::unique_ptr<DevicePool> src_, dst_;
  testing::Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_F(NcclTransportTest, OptionsAreValidated) {
  SenderOptions so;
  so.transport = "nccl";
  so.layout = layout_;
  DevicePool pool(layout_, 4, 0);
  EXPECT_EQ(CreateSender(so, &pool).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclTransportTest, LayoutMismatchIsRefusedNamingTheField) {
  KvLayout other = layout_;
  other.num_kv_heads += 1;
  Start(0, 0, other);
  receiver_->Expect({1, {0}});
  auto h = sender_->Begin(Target(1, {0}), {0});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("num_kv_heads"), std::string::npos) << h.status();
  receiver_->CancelAndWait(1);
}

TEST_F(NcclTransportTest, TransfersDeviceRegionsBitExact) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  Start(0, 1, layout_);
  src_->Fill(7);
  receiver_->Expect({2, {3, 4, 5}});
  ASSERT_TRUE(
      testing::SendAll(sender_.get(), Target(2, {3, 4, 5}), {10, 11, 12}, layout_.num_layers, "tok")
          .ok());
  CompletedTransfer c = completions_.WaitFor(2, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "tok");
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    EXPECT_EQ(dst_->Read(l, 3), src_->Read(l, 10));
    EXPECT_EQ(dst_->Read(l, 5), src_->Read(l, 12));
  }
  EXPECT_EQ(dst_->Read(0, 6), std::vector<uint8_t>(layout_.region_bytes(), 0));
  // Unknown transfers fail at Begin; a stale incarnation too.
  EXPECT_EQ(sender_->Begin(Target(99, {1}), {1}).status().code(), absl::StatusCode::kNotFound);
  TransferTarget stale = Target(2, {1});
  stale.incarnation += 1;
  EXPECT_EQ(sender_->Begin(stale, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender_->num_in_flight(), 0);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

TEST_F(NcclTransportTest, DeadlineAndAbortEndBothSides) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  Start(0, 1, layout_);
  receiver_->Expect({3, {1, 2}});
  TransferTarget t = Target(3, {1, 2});
  t.deadline = absl::Now() + absl::Milliseconds(200);
  auto h = sender_->Begin(t, {1, 2});
  ASSERT_TRUE(h.ok()) << h.status();
  sender_->SendLayer(*h, 0);
  EXPECT_EQ(completions_.WaitFor(3, 0).status.code(), absl::StatusCode::kDeadlineExceeded);
  sender_->Abort(*h);
  receiver_->CancelAndWait(3);
  EXPECT_EQ(sender_->num_in_flight(), 0);
}

#else

TEST(NcclTransportTest, NotBuilt) { GTEST_SKIP() << "built without CUDA/NCCL"; }

#endif

}  // namespace
}  // namespace tandem::kvtransfer
