// Transfers with windowed layers (Expectation / TransferTarget::window_layers): a windowed layer
// moves only the blocks from window_first on, over real sockets (tcp) and in-process (loopback).
// The receiver checks exactly those (layer, block) cells: it refuses a windowed layer's block
// before the window (nothing is written there) and fails a transfer that lacks one of the
// window's.

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtransfer/transfer_window.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::Range;
using testing::SendAll;

constexpr int32_t kBlocks = 10;
constexpr int32_t kWindowFirst = 6;

KvLayout Layout() {
  KvLayout l;
  l.model_id = "gemma-test";
  l.num_layers = 6;
  l.num_kv_heads = 2;
  l.head_dim = 16;
  l.block_size = 4;
  l.kv_dtype = DType::kBF16;  // region = 512 bytes
  return l;
}

class TransportWindowTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    layout_ = Layout();
    src_ = std::make_unique<FakePool>(layout_, 32);
    dst_ = std::make_unique<FakePool>(layout_, 32);
    src_->Fill(3);
    ReceiverOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.faults_from_env = false;
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  void TearDown() override {
    EXPECT_EQ(sender_->num_in_flight(), 0);
    EXPECT_EQ(receiver_->num_in_flight(), 0);
    EXPECT_TRUE(dst_->GuardsIntact());
    sender_.reset();
    receiver_.reset();
  }
  KvSender* Sender(FaultOptions faults = {}) {
    SenderOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.max_message_bytes = 2 * layout_.region_bytes();  // two blocks a message
    o.faults = faults;
    o.faults_from_env = false;
    auto s = CreateSender(o, src_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
    return sender_.get();
  }
  // Local layers 0, 2 and 4 (as Gemma's alternate): blocks [kWindowFirst, kBlocks) only.
  static Expectation Expect(uint64_t id) {
    Expectation e;
    e.transfer_id = id;
    e.dst_blocks = Dst();
    e.window_layers = {0, 2, 4};
    e.window_first = kWindowFirst;
    return e;
  }
  TransferTarget Target(const Expectation& e) {
    TransferTarget t;
    t.endpoint = receiver_->endpoint();
    t.incarnation = receiver_->incarnation();
    t.transfer_id = e.transfer_id;
    t.dst_blocks = e.dst_blocks;
    t.window_layers = e.window_layers;
    t.window_first = e.window_first;
    t.deadline = absl::Now() + absl::Seconds(20);
    return t;
  }
  static std::vector<int32_t> Src() { return Range(0, kBlocks); }
  static std::vector<int32_t> Dst() { return Range(20, kBlocks); }
  // Nothing was written into a windowed layer's blocks before the window.
  void ExpectOutsideWindowUntouched() {
    for (int64_t l : {0, 2, 4}) {
      for (int32_t i = 0; i < kWindowFirst; ++i) {
        EXPECT_TRUE(dst_->IsZero(l, Dst()[i])) << "layer " << l << " block " << Dst()[i];
      }
    }
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> src_, dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_P(TransportWindowTest, WindowedLayersMoveOnlyTheWindowsBlocks) {
  KvSender* sender = Sender();
  const Expectation e = Expect(7);
  receiver_->Expect(e);
  ASSERT_TRUE(SendAll(sender, Target(e), Src(), layout_.num_layers, "first").ok());
  CompletedTransfer c = completions_.WaitFor(7, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "first");
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    const int32_t from = l % 2 == 0 ? kWindowFirst : 0;
    for (int32_t i = from; i < kBlocks; ++i) {
      EXPECT_TRUE(testing::SameRegion(*src_, l, Src()[i], *dst_, Dst()[i]))
          << "layer " << l << " block " << i;
    }
  }
  ExpectOutsideWindowUntouched();
  const int64_t regions = TransferRegions(e.window_layers, e.window_first, 6, kBlocks);
  EXPECT_EQ(regions, 6 * 10 - 3 * 6);
  EXPECT_EQ(sender->stats().bytes, static_cast<uint64_t>(regions) * layout_.region_bytes());
  EXPECT_EQ(receiver_->stats().bytes, sender->stats().bytes);
}

TEST_P(TransportWindowTest, DataBeforeTheWindowIsRefusedAndNotWritten) {
  KvSender* sender = Sender();
  const Expectation e = Expect(8);
  receiver_->Expect(e);
  TransferTarget t = Target(e);
  t.window_layers.clear();  // a sender that sends every block of every layer
  t.window_first = 0;
  absl::Status s = SendAll(sender, t, Src(), layout_.num_layers);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("windowed"), std::string::npos) << s;
  CompletedTransfer c = completions_.WaitFor(8, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status)) << c.status;
  ExpectOutsideWindowUntouched();
  receiver_->CancelAndWait(8);
}

TEST_P(TransportWindowTest, AMissingWindowBlockFailsTheTransfer) {
  KvSender* sender = Sender();
  const Expectation e = Expect(9);
  receiver_->Expect(e);
  TransferTarget t = Target(e);
  t.window_first = kWindowFirst + 1;  // the sender skips one block of each windowed layer
  absl::Status s = SendAll(sender, t, Src(), layout_.num_layers);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  CompletedTransfer c = completions_.WaitFor(9, 0);
  EXPECT_TRUE(absl::IsDataLoss(c.status)) << c.status;
  EXPECT_NE(c.status.message().find("first missing: layer 0 block 26"), std::string::npos)
      << c.status;
  receiver_->CancelAndWait(9);
}

TEST_P(TransportWindowTest, ADroppedWindowedLayerMessageFailsThenARetrySucceeds) {
  FaultOptions faults;
  faults.kv_drop = 1.0;
  faults.max_faults = 1;  // the first DATA message: layer 0, windowed
  faults.seed = 1;
  KvSender* sender = Sender(faults);
  const Expectation e = Expect(10);
  receiver_->Expect(e);
  absl::Status s = SendAll(sender, Target(e), Src(), layout_.num_layers);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  CompletedTransfer c = completions_.WaitFor(10, 0);
  EXPECT_TRUE(absl::IsDataLoss(c.status)) << c.status;
  EXPECT_NE(c.status.message().find("first missing: layer 0 block 26"), std::string::npos)
      << c.status;
  // The expectation stays: the next attempt fills it.
  TransferTarget retry = Target(e);
  retry.attempt = 1;
  ASSERT_TRUE(SendAll(sender, retry, Src(), layout_.num_layers).ok());
  EXPECT_TRUE(completions_.WaitFor(10, 1).status.ok());
  ExpectOutsideWindowUntouched();
}

TEST_P(TransportWindowTest, AnInvalidWindowIsRefused) {
  KvSender* sender = Sender();
  Expectation e = Expect(11);
  e.window_first = kBlocks + 1;
  receiver_->Expect(e);  // unusable: every attempt is refused
  TransferTarget t = Target(Expect(11));
  absl::Status s = SendAll(sender, t, Src(), layout_.num_layers);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("window_first"), std::string::npos) << s;
  receiver_->CancelAndWait(11);
  t.window_layers = {6};  // the model has layers [0, 6): refused by the sender itself
  EXPECT_TRUE(absl::IsInvalidArgument(sender->Begin(t, Src()).status()));
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportWindowTest, ::testing::Values("tcp", "loopback"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::kvtransfer
