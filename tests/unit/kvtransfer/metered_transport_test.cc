// TransferHooks through SenderOptions / ReceiverOptions: every transport reports one start and
// exactly one end per transfer, with bytes and blocks on success and the reason on failure.

#include <array>
#include <mutex>

#include "gtest/gtest.h"
#include "kvtransfer/metered.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::Done;
using testing::FakePool;
using testing::Range;
using testing::SendAll;

// Records what the hooks were told, per direction.
class Recorder : public TransferHooks {
 public:
  struct Side {
    int started = 0;
    int succeeded = 0;
    std::array<int, kNumTransferFailures> failed{};
    int64_t bytes = 0;
    int64_t blocks = 0;
    int ended() const {
      int n = succeeded;
      for (int f : failed) n += f;
      return n;
    }
    int failures(TransferFailure reason) const { return failed[static_cast<int>(reason)]; }
  };

  void TransferStarted(TransferDirection d) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++sides_[static_cast<int>(d)].started;
  }
  void TransferSucceeded(TransferDirection d, double seconds, int64_t bytes,
                         int64_t blocks) override {
    std::lock_guard<std::mutex> lock(mu_);
    Side& s = sides_[static_cast<int>(d)];
    EXPECT_GE(seconds, 0);
    ++s.succeeded;
    s.bytes += bytes;
    s.blocks += blocks;
  }
  void TransferFailed(TransferDirection d, TransferFailure reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++sides_[static_cast<int>(d)].failed[static_cast<int>(reason)];
  }
  Side send() {
    std::lock_guard<std::mutex> lock(mu_);
    return sides_[0];
  }
  Side receive() {
    std::lock_guard<std::mutex> lock(mu_);
    return sides_[1];
  }

 private:
  std::mutex mu_;
  std::array<Side, 2> sides_;
};

class MeteredTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    src_ = std::make_unique<FakePool>(layout_, 32);
    dst_ = std::make_unique<FakePool>(layout_, 32);
    src_->Fill(3);
    ReceiverOptions ro;
    ro.transport = GetParam();
    ro.layout = layout_;
    ro.faults_from_env = false;
    ro.hooks = &hooks_;
    auto r = CreateReceiver(ro, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  void TearDown() override {
    sender_.reset();
    receiver_.reset();
    // Every transfer that started has ended, once.
    EXPECT_EQ(hooks_.send().started, hooks_.send().ended());
    EXPECT_EQ(hooks_.receive().started, hooks_.receive().ended());
  }
  KvSender* Sender(FaultOptions faults = {}) {
    SenderOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.faults_from_env = false;
    o.faults = faults;
    o.hooks = &hooks_;
    auto s = CreateSender(o, src_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
    return sender_.get();
  }
  TransferTarget Target(uint64_t id, std::vector<int32_t> dst, uint32_t attempt = 0) {
    TransferTarget t;
    t.endpoint = receiver_->endpoint();
    t.incarnation = receiver_->incarnation();
    t.transfer_id = id;
    t.attempt = attempt;
    t.dst_blocks = std::move(dst);
    t.deadline = absl::Now() + absl::Seconds(20);
    return t;
  }
  int64_t Bytes(int64_t blocks) const {
    return blocks * layout_.num_layers * static_cast<int64_t>(layout_.region_bytes());
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> src_, dst_;
  Recorder hooks_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_P(MeteredTransportTest, SuccessCountsBytesAndBlocksOnBothSides) {
  KvSender* sender = Sender();
  receiver_->Expect({1, Range(0, 3)});
  EXPECT_EQ(hooks_.receive().started, 1);
  ASSERT_TRUE(SendAll(sender, Target(1, Range(0, 3)), Range(5, 3), layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(1, 0).status.ok());
  for (Recorder::Side s : {hooks_.send(), hooks_.receive()}) {
    EXPECT_EQ(s.started, 1);
    EXPECT_EQ(s.succeeded, 1);
    EXPECT_EQ(s.blocks, 3);
    EXPECT_EQ(s.bytes, Bytes(3));
  }
  receiver_->CancelAndWait(1);  // after success (as the decode worker does when the request ends)
  EXPECT_EQ(hooks_.receive().ended(), 1);
}

TEST_P(MeteredTransportTest, RefusedBeginIsAFailedTransfer) {
  KvSender* sender = Sender();
  receiver_->Expect({2, Range(0, 2)});
  TransferTarget stale = Target(2, Range(0, 2));
  stale.incarnation ^= 1;  // a restarted receiver
  EXPECT_EQ(sender->Begin(stale, Range(0, 2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(hooks_.send().started, 1);
  EXPECT_EQ(hooks_.send().failures(TransferFailure::kIncompatible), 1);
  receiver_->CancelAndWait(2);  // the receiver's side was never fed: cancelled
  EXPECT_EQ(hooks_.receive().failures(TransferFailure::kAborted), 1);
}

TEST_P(MeteredTransportTest, AbortBeforeFinishEndsTheTransferOnce) {
  KvSender* sender = Sender();
  receiver_->Expect({3, Range(0, 4)});
  auto h = sender->Begin(Target(3, Range(0, 4)), Range(0, 4));
  ASSERT_TRUE(h.ok());
  sender->SendLayer(*h, 0);
  sender->Abort(*h);
  sender->Abort(*h);  // twice: still one end
  EXPECT_EQ(hooks_.send().failures(TransferFailure::kAborted), 1);
  EXPECT_EQ(completions_.WaitFor(3, 0).status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(hooks_.receive().failures(TransferFailure::kAborted), 1);
  receiver_->CancelAndWait(3);  // already ended: no second failure
  EXPECT_EQ(hooks_.receive().ended(), 1);
}

TEST_P(MeteredTransportTest, CorruptionThenARetryOnTheSameReservation) {
  FaultOptions faults;
  faults.kv_corrupt = 1;
  faults.max_faults = 1;
  faults.seed = 1;
  KvSender* sender = Sender(faults);
  receiver_->Expect({4, Range(0, 5)});
  EXPECT_EQ(SendAll(sender, Target(4, Range(0, 5)), Range(0, 5), layout_.num_layers).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(completions_.WaitFor(4, 0).status.code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(SendAll(sender, Target(4, Range(0, 5), 1), Range(0, 5), layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(4, 1).status.ok());
  for (Recorder::Side s : {hooks_.send(), hooks_.receive()}) {
    EXPECT_EQ(s.started, 2);
    EXPECT_EQ(s.failures(TransferFailure::kChecksum), 1);
    EXPECT_EQ(s.succeeded, 1);
    EXPECT_EQ(s.bytes, Bytes(5));
  }
  receiver_->CancelAndWait(4);
}

TEST_P(MeteredTransportTest, CancelledExpectationIsAnAbortedTransfer) {
  receiver_->Expect({5, Range(0, 2)});
  receiver_->Expect({5, Range(2, 2)});  // replaces the first: it ends aborted
  receiver_->CancelAndWait(5);
  EXPECT_EQ(hooks_.receive().started, 2);
  EXPECT_EQ(hooks_.receive().failures(TransferFailure::kAborted), 2);
}

TEST(TransferFailureOfTest, MapsStatusCodesToReasons) {
  EXPECT_EQ(TransferFailureOf(absl::DeadlineExceededError("")), TransferFailure::kTimeout);
  EXPECT_EQ(TransferFailureOf(absl::AbortedError("")), TransferFailure::kAborted);
  EXPECT_EQ(TransferFailureOf(absl::CancelledError("")), TransferFailure::kAborted);
  EXPECT_EQ(TransferFailureOf(absl::UnavailableError("")), TransferFailure::kConnection);
  EXPECT_EQ(TransferFailureOf(absl::DataLossError("")), TransferFailure::kChecksum);
  EXPECT_EQ(TransferFailureOf(absl::FailedPreconditionError("")), TransferFailure::kIncompatible);
  EXPECT_EQ(TransferFailureOf(absl::UnauthenticatedError("")), TransferFailure::kUnauthenticated);
  EXPECT_EQ(TransferFailureOf(absl::InternalError("")), TransferFailure::kOther);
}

INSTANTIATE_TEST_SUITE_P(Transports, MeteredTransportTest, ::testing::Values("tcp", "loopback"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::kvtransfer
