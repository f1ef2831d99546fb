// The TCP transport against hand-written peers speaking the wire protocol: what a buggy,
// malicious, silent or stalled peer can and cannot do.

#include <poll.h>
#include <sys/socket.h>

#include <thread>

#include "gtest/gtest.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"
#include "tests/unit/kvtransfer/raw_peer.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::Range;
using testing::SendAll;
using wire::FrameType;

using testing::RawPeer;

class TcpProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    dst_ = std::make_unique<FakePool>(layout_, 64);
    ReceiverOptions o;
    o.layout = layout_;
    o.handshake_timeout = absl::Milliseconds(200);
    o.deadline_grace = absl::Milliseconds(50);
    o.faults_from_env = false;
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  void TearDown() override {
    EXPECT_EQ(receiver_->num_in_flight(), 0);
    EXPECT_TRUE(dst_->GuardsIntact());
  }
  std::string Payload(size_t regions, char fill) {
    return std::string(regions * layout_.region_bytes(), fill);
  }
  void Begin(RawPeer& p, uint64_t id, uint32_t attempt, const std::vector<int32_t>& dst,
             int64_t deadline_ms = -1) {
    p.Send(FrameType::kBegin,
           wire::EncodeBegin({id, attempt, receiver_->incarnation(), deadline_ms, dst}));
  }
  bool AllZero() {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < 64; ++b) {
        if (!dst_->IsZero(l, b)) return false;
      }
    }
    return true;
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
};

TEST_F(TcpProtocolTest, DataForForeignBlocksOrUnknownTransfersIsDiscarded) {
  RawPeer p = RawPeer::Connect(receiver_->endpoint());
  ASSERT_EQ(p.Handshake(layout_), receiver_->incarnation());
  receiver_->Expect({1, {1, 2}});
  Begin(p, 1, 0, {1, 2});
  p.SendData(1, 0, 0, {1, 50}, Payload(2, '\xee'));  // block 50 is not the transfer's
  absl::Status s = p.ReadResult();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("50"), std::string::npos) << s;
  EXPECT_EQ(completions_.WaitFor(1, 0).status.code(), absl::StatusCode::kInvalidArgument);
  p.SendData(999, 0, 0, {1}, Payload(1, '\xee'));  // nobody expects transfer 999
  EXPECT_EQ(p.ReadResult().code(), absl::StatusCode::kNotFound);
  p.SendData(1, 0, 1, {1, 2}, Payload(2, '\xee'));  // more data of the failed attempt
  EXPECT_TRUE(AllZero());

  // The stream stays in sync: a correct retry over the same connection completes.
  Begin(p, 1, 1, {1, 2});
  for (uint32_t l = 0; l < layout_.num_layers; ++l) {
    p.SendData(1, 1, l, {2, 1}, Payload(1, 'b') + Payload(1, 'a'));
  }
  p.Send(FrameType::kFinish, wire::EncodeFinish({1, 1, 4, 4 * 2 * layout_.region_bytes(), "t"}));
  uint64_t id;
  uint32_t attempt;
  ASSERT_TRUE(p.ReadResult(&id, &attempt).ok());
  EXPECT_EQ(attempt, 1u);
  EXPECT_TRUE(completions_.WaitFor(1, 1).status.ok());
  EXPECT_EQ(dst_->Region(3, 1)[0], 'a');
  EXPECT_EQ(dst_->Region(3, 2)[0], 'b');
  EXPECT_TRUE(dst_->IsZero(0, 0));
  EXPECT_TRUE(dst_->IsZero(0, 3));
}

TEST_F(TcpProtocolTest, PayloadChecksumMismatchIsDataLoss) {
  RawPeer p = RawPeer::Connect(receiver_->endpoint());
  p.Handshake(layout_);
  receiver_->Expect({2, {5}});
  Begin(p, 2, 0, {5});
  p.SendData(2, 0, 0, {5}, Payload(1, 'x'), /*good_crc=*/false);
  EXPECT_EQ(p.ReadResult().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(completions_.WaitFor(2, 0).status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(receiver_->stats().checksum_failures, 1u);
  // An incomplete FINISH is refused too.
  Begin(p, 2, 1, {5});
  p.Send(FrameType::kFinish, wire::EncodeFinish({2, 1, 0, 0, ""}));
  absl::Status s = p.ReadResult();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("layer 0 block 5"), std::string::npos) << s;
  receiver_->CancelAndWait(2);
}

TEST_F(TcpProtocolTest, SilentSenderExpiresAtTheReceiver) {
  RawPeer p = RawPeer::Connect(receiver_->endpoint());
  p.Handshake(layout_);
  receiver_->Expect({3, {1}});
  Begin(p, 3, 0, {1}, /*deadline_ms=*/100);
  const absl::Time start = absl::Now();
  EXPECT_EQ(completions_.WaitFor(3, 0).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(p.ReadResult().code(), absl::StatusCode::kDeadlineExceeded);
  receiver_->CancelAndWait(3);
}

TEST_F(TcpProtocolTest, SenderVanishingMidTransferFailsTheAttempt) {
  receiver_->Expect({4, {1, 2}});
  {
    RawPeer p = RawPeer::Connect(receiver_->endpoint());
    p.Handshake(layout_);
    Begin(p, 4, 0, {1, 2});
    p.SendData(4, 0, 0, {1, 2}, Payload(2, 'x'));
    // Half a DATA message, then the process dies.
    wire::DataMeta d{4, 0, 1, 2 * layout_.region_bytes(), {1, 2}};
    p.SendRaw(wire::MakeFrame(FrameType::kData, 0, wire::EncodeDataMeta(d)) + Payload(1, 'y'));
  }
  CompletedTransfer c = completions_.WaitFor(4, 0, absl::Seconds(2));
  EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
  receiver_->CancelAndWait(4);
}

TEST_F(TcpProtocolTest, BadPeersAreDisconnectedAndOthersKeepWorking) {
  RawPeer silent = RawPeer::Connect(receiver_->endpoint());  // never says HELLO
  RawPeer garbage = RawPeer::Connect(receiver_->endpoint());
  garbage.SendRaw(std::string(64, 'g'));
  RawPeer bad_meta = RawPeer::Connect(receiver_->endpoint());
  bad_meta.Handshake(layout_);
  std::string frame = wire::MakeFrame(FrameType::kBegin, 0, wire::EncodeBegin({1, 0, 1, -1, {1}}));
  frame.back() ^= 1;  // metadata no longer matches its checksum
  bad_meta.SendRaw(frame);
  RawPeer other_version = RawPeer::Connect(receiver_->endpoint());
  wire::Hello h;
  h.layout = layout_;
  h.layout.protocol_version = kKvTransferProtocolVersion + 1;
  other_version.Send(FrameType::kHello, wire::EncodeHello(h));
  auto refuse = other_version.Read();
  ASSERT_TRUE(refuse.ok());
  EXPECT_EQ(refuse->first, FrameType::kRefuse);
  wire::Outcome o;
  ASSERT_TRUE(wire::DecodeOutcome(refuse->second, &o).ok());
  EXPECT_NE(o.status.message().find("protocol_version"), std::string::npos) << o.status;

  RawPeer bad_length = RawPeer::Connect(receiver_->endpoint());
  bad_length.Handshake(layout_);
  wire::DataMeta lying{1, 0, 0, 3 * layout_.region_bytes(), {1}};  // one block, three regions
  bad_length.Send(FrameType::kData, wire::EncodeDataMeta(lying));

  EXPECT_TRUE(bad_length.ClosedWithin(absl::Seconds(2)));
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(2)));
  EXPECT_TRUE(garbage.ClosedWithin(absl::Seconds(2)));
  EXPECT_TRUE(bad_meta.ClosedWithin(absl::Seconds(2)));
  EXPECT_TRUE(other_version.ClosedWithin(absl::Seconds(2)));

  FakePool src(layout_, 8);
  src.Fill(3);
  SenderOptions so;
  so.layout = layout_;
  auto sender = CreateSender(so, &src);
  ASSERT_TRUE(sender.ok());
  receiver_->Expect({5, {7}});
  TransferTarget t{receiver_->endpoint(), receiver_->incarnation(), 5, 0, {7}};
  ASSERT_TRUE(SendAll(sender->get(), t, {3}, layout_.num_layers).ok());
  EXPECT_TRUE(testing::SameRegion(src, 2, 3, *dst_, 7));
}

// A "receiver" that handshakes and then never reads nor answers again.
class StalledReceiver {
 public:
  explicit StalledReceiver(const KvLayout& layout) {
    auto listener = tcp::Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(listener.ok());
    listener_ = std::move(*listener);
    thread_ = std::thread([this, layout] {
      pollfd pfd{listener_.get(), POLLIN, 0};
      if (poll(&pfd, 1, 5000) <= 0) return;
      RawPeer peer(tcp::Fd(accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK)));
      if (!peer.Read().ok()) return;
      wire::Welcome w;
      w.incarnation = 77;
      w.layout = layout;
      peer.Send(FrameType::kWelcome, wire::EncodeWelcome(w));
      while (!stop_) absl::SleepFor(absl::Milliseconds(5));
    });
  }
  ~StalledReceiver() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  tcp::Fd listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sends every layer of `blocks` blocks; the outcome and how long it took.
std::pair<absl::Status, absl::Duration> SendToStalled(const KvLayout& layout, int32_t blocks,
                                                      absl::Duration io_timeout,
                                                      absl::Duration deadline) {
  StalledReceiver stalled(layout);
  SenderOptions so;
  so.layout = layout;
  so.io_timeout = io_timeout;
  so.faults_from_env = false;
  FakePool src(layout, blocks);
  auto sender = CreateSender(so, &src);
  EXPECT_TRUE(sender.ok());
  TransferTarget t{stalled.endpoint(), 77, 6, 0, Range(0, blocks)};
  t.deadline = absl::Now() + deadline;
  const absl::Time start = absl::Now();
  absl::Status s = SendAll(sender->get(), t, Range(0, blocks), layout.num_layers);
  const absl::Duration took = absl::Now() - start;
  sender->reset();  // must not hang either
  EXPECT_LT(absl::Now() - start, took + 2 * io_timeout + absl::Seconds(1));
  return {s, took};
}

TEST(TcpStalledPeerTest, WriterGivesUpAfterIoTimeout) {
  KvLayout big = testing::SmallLayout();
  big.num_kv_heads = 16;
  big.block_size = 16;
  big.head_dim = 32;  // 32 KiB regions: 4 layers x 256 blocks = 32 MiB, beyond socket buffers
  auto [s, took] = SendToStalled(big, 256, absl::Milliseconds(300), absl::Seconds(30));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), absl::StatusCode::kUnknown) << s;  // not the test's own wait timing out
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(TcpStalledPeerTest, DeadlineEndsATransferWaitingForItsResult) {
  auto [s, took] =
      SendToStalled(testing::SmallLayout(), 4, absl::Seconds(10), absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(took, absl::Seconds(2));
}

TEST_F(TcpProtocolTest, FaultInjectedCloseFailsBothSidesAndTheSenderReconnects) {
  FakePool src(layout_, 8);
  SenderOptions so;
  so.layout = layout_;
  so.faults.kv_close = 1;
  so.faults.max_faults = 1;
  auto sender = CreateSender(so, &src);
  ASSERT_TRUE(sender.ok());
  receiver_->Expect({9, {1}});
  TransferTarget t{receiver_->endpoint(), receiver_->incarnation(), 9, 0, {1}};
  EXPECT_EQ(SendAll(sender->get(), t, {1}, layout_.num_layers).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(completions_.WaitFor(9, 0).status.code(), absl::StatusCode::kUnavailable);
  t.attempt = 1;
  ASSERT_TRUE(SendAll(sender->get(), t, {1}, layout_.num_layers).ok());
  EXPECT_EQ((*sender)->stats().connects, 2u);
  EXPECT_EQ((*sender)->stats().connections_lost, 1u);
}

TEST_F(TcpProtocolTest, ReceiverSideCorruptionIsDetected) {
  ReceiverOptions o;
  o.layout = layout_;
  o.faults.kv_corrupt = 1;
  o.faults.max_faults = 1;
  FakePool dst(layout_, 8), src(layout_, 8);
  Completions completions;
  auto receiver = CreateReceiver(o, &dst, completions.Callback());
  ASSERT_TRUE(receiver.ok());
  SenderOptions so;
  so.layout = layout_;
  auto sender = CreateSender(so, &src);
  (*receiver)->Expect({10, {1, 2}});
  TransferTarget t{(*receiver)->endpoint(), (*receiver)->incarnation(), 10, 0, {1, 2}};
  EXPECT_EQ(SendAll(sender->get(), t, {1, 2}, layout_.num_layers).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(completions.WaitFor(10, 0).status.code(), absl::StatusCode::kDataLoss);
  t.attempt = 1;
  ASSERT_TRUE(SendAll(sender->get(), t, {1, 2}, layout_.num_layers).ok());
  EXPECT_EQ((*receiver)->num_in_flight(), 0);
}

TEST(TcpEndpointTest, WildcardListenersAdvertiseARoutableHost) {
  KvLayout layout = testing::SmallLayout();
  FakePool dst(layout, 4), src(layout, 4);
  src.Fill(9);
  Completions completions;
  ReceiverOptions o;
  o.layout = layout;
  o.host = "0.0.0.0";
  o.advertise_host = "127.0.0.1";
  auto r = CreateReceiver(o, &dst, completions.Callback());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->endpoint().rfind("127.0.0.1:", 0), 0u) << (*r)->endpoint();
  SenderOptions so;
  so.layout = layout;
  auto s = CreateSender(so, &src);
  (*r)->Expect({1, {2}});
  TransferTarget t{(*r)->endpoint(), (*r)->incarnation(), 1, 0, {2}};
  ASSERT_TRUE(SendAll(s->get(), t, {1}, layout.num_layers).ok());
  EXPECT_TRUE(testing::SameRegion(src, 3, 1, dst, 2));
  o.advertise_host.clear();
  auto hostname = CreateReceiver(o, &dst, completions.Callback());
  ASSERT_TRUE(hostname.ok());
  EXPECT_NE((*hostname)->endpoint().rfind("0.0.0.0", 0), 0u) << (*hostname)->endpoint();
}

}  // namespace
}  // namespace tandem::kvtransfer
