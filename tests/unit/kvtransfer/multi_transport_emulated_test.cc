// A worker speaking nccl and cuda-ipc at once (`--kv-transport auto` on a GPU), on the CPU
// emulator of CUDA and NCCL, its control messages handed straight to the receiver: each transfer
// runs on the transport its target names, control messages reach the transport whose kinds they
// carry, an expectation waits on both (a retry may come over the other one) and completes once.

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/device_pool.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::DevicePool;

constexpr int64_t kBlocks = 8;

class MultiTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ReceiverOptions ro;
    ro.transport = "nccl,cuda-ipc";
    ro.layout = layout_;
    ro.name = "decode-kv";
    auto receiver = CreateReceiver(ro, &dst_, completions_.Callback());
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);
    SenderOptions so;
    so.transport = "nccl,cuda-ipc";
    so.layout = layout_;
    so.io_timeout = absl::Seconds(5);
    KvReceiver* r = receiver_.get();
    so.control_channel = [r](const std::string&, const std::string& bytes) {
      return r->HandleControl(bytes);
    };
    auto sender = CreateSender(so, &src_);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
  }

  TransferTarget Target(std::string transport, uint64_t id, std::vector<int32_t> dst,
                        uint32_t attempt) {
    TransferTarget t{receiver_->endpoint(), receiver_->incarnation(), id, attempt, std::move(dst)};
    t.deadline = absl::Now() + absl::Seconds(20);
    t.transport = std::move(transport);
    return t;
  }

  KvLayout layout_ = testing::SmallLayout();
  DevicePool src_{layout_, kBlocks};
  DevicePool dst_{layout_, kBlocks};
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_F(MultiTransportTest, RunsEachTransferOnTheTransportItsTargetNames) {
  src_.Fill(5);
  receiver_->Expect({1, {2, 3}});
  EXPECT_EQ(receiver_->num_in_flight(), 1);
  ASSERT_TRUE(
      testing::SendAll(sender_.get(), Target("nccl", 1, {2, 3}, 0), {6, 7}, layout_.num_layers)
          .ok());
  CompletedTransfer c = completions_.WaitFor(1, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_TRUE(dst_.LandedExactly(5, {6, 7}, {2, 3}));
  EXPECT_EQ(receiver_->num_in_flight(), 0);
  EXPECT_EQ(sender_->num_in_flight(), 0);
  EXPECT_EQ(completions_.size(), 1u);
}

TEST_F(MultiTransportTest, RefusesATargetWithoutOneOfItsTransports) {
  receiver_->Expect({1, {2}});
  for (const std::string t : {"", "tcp", "nccl,cuda-ipc"}) {
    absl::StatusOr<TransferHandle> h = sender_->Begin(Target(t, 1, {2}, 0), {1});
    ASSERT_FALSE(h.ok()) << "'" << t << "'";
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
    EXPECT_NE(h.status().message().find("nccl,cuda-ipc"), std::string::npos) << h.status();
  }
  EXPECT_EQ(sender_->num_in_flight(), 0);
  receiver_->CancelAndWait(1);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

TEST_F(MultiTransportTest, ControlMessagesReachTheTransportOfTheirKind) {
  absl::StatusOr<std::string> unknown = receiver_->HandleControl(std::string("\x20garbage", 8));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("speaks nccl,cuda-ipc"), std::string::npos);
  EXPECT_FALSE(receiver_->HandleControl("").ok());
  // A truncated request of each transport's kinds is that transport's to refuse.
  for (const char kind : {static_cast<char>(kNcclFirstKind), static_cast<char>(kCudaIpcLastKind)}) {
    absl::StatusOr<std::string> r = receiver_->HandleControl(std::string(1, kind));
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().message().find("speaks"), std::string::npos) << r.status();
  }
}

// The first attempt over cuda-ipc cannot map the pool (the emulator, like CUDA, refuses to open a
// process's own IPC handle); the retry over nccl fills the same blocks and completes once.
TEST_F(MultiTransportTest, ARetryMayComeOverTheOtherTransport) {
  src_.Fill(9);
  receiver_->Expect({4, {0, 1}});
  absl::Status first =
      testing::SendAll(sender_.get(), Target("cuda-ipc", 4, {0, 1}, 0), {4, 5}, layout_.num_layers);
  if (first.ok()) {
    // Failed asynchronously instead: its outcome is reported, the expectation stays.
    EXPECT_FALSE(completions_.WaitFor(4, 0).status.ok());
  }
  EXPECT_EQ(receiver_->num_in_flight(), 1);
  ASSERT_TRUE(
      testing::SendAll(sender_.get(), Target("nccl", 4, {0, 1}, 1), {4, 5}, layout_.num_layers)
          .ok());
  ASSERT_TRUE(completions_.WaitFor(4, 1).status.ok());
  EXPECT_TRUE(dst_.LandedExactly(9, {4, 5}, {0, 1}));
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

TEST_F(MultiTransportTest, CancelEndsTheExpectationOnBoth) {
  src_.Fill(2);
  receiver_->Expect({7, {4}});
  receiver_->CancelAndWait(7);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
  // Late data for it is refused by either transport.
  absl::Status st =
      testing::SendAll(sender_.get(), Target("nccl", 7, {4}, 0), {1}, layout_.num_layers);
  if (st.ok()) st = completions_.WaitFor(7, 0, absl::Seconds(2)).status;
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(dst_.LandedExactly(0, {}, {}));  // nothing written
  EXPECT_EQ(completions_.size(), 0u);
}

}  // namespace
}  // namespace tandem::kvtransfer
