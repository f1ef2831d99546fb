// A tcp receiver's bounds (README.md, "Bounds"): connections over its caps (total and per peer
// address) are closed at once, a handshake is cut at its deadline however its bytes trickle in,
// messages before the handshake are small, and every connection's buffers are charged to the
// memory budget before they are allocated; honest transfers go on meanwhile.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"
#include "tests/unit/kvtransfer/raw_peer.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::Eventually;
using testing::FakePool;
using testing::Range;
using testing::RawPeer;
using testing::SendAll;
using wire::FrameType;

constexpr char kSecret[] = "0123456789abcdef-the-cluster-secret";

// Counts Refused(receive, reason).
class LimitHooks : public TransferHooks {
 public:
  void TransferStarted(TransferDirection) override {}
  void TransferSucceeded(TransferDirection, double, int64_t, int64_t) override {}
  void TransferFailed(TransferDirection, TransferFailure) override {}
  void Refused(TransferDirection d, KvRefusal reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (d == TransferDirection::kReceive) ++counts_[reason];
  }
  int count(KvRefusal reason) {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[reason];
  }

 private:
  std::mutex mu_;
  std::map<KvRefusal, int> counts_;
};

// A connection to `endpoint` from the loopback address `source` (127.0.0.x).
RawPeer ConnectFrom(const std::string& source, const std::string& endpoint) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(tcp::SplitHostPort(endpoint, &host, &port).ok());
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &to.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  tcp::ConfigureSocket(fd, testing::kIo);
  return RawPeer(tcp::Fd(fd));
}

// Open: nothing arrives and the receiver did not close it within a short while.
bool StaysOpen(RawPeer& p) {
  auto m = p.Read(absl::Milliseconds(300));
  return !m.ok() && absl::IsDeadlineExceeded(m.status());
}

std::string HelloFrame(const KvLayout& layout) {
  wire::Hello h;
  h.layout = layout;
  return wire::MakeFrame(FrameType::kHello, 0, wire::EncodeHello(h));
}

class TcpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    src_ = std::make_unique<FakePool>(layout_, 16);
    dst_ = std::make_unique<FakePool>(layout_, 16);
    src_->Fill(11);
  }
  void TearDown() override {
    if (receiver_) {
      EXPECT_TRUE(dst_->GuardsIntact());
    }
  }
  void StartReceiver(const ReceiverLimits& limits, absl::Duration handshake_timeout) {
    ReceiverOptions o;
    o.layout = layout_;
    o.secret = kSecret;
    o.limits = limits;
    o.handshake_timeout = handshake_timeout;
    o.hooks = &hooks_;
    o.faults_from_env = false;
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  std::unique_ptr<KvSender> NewSender() {
    SenderOptions o;
    o.layout = layout_;
    o.secret = kSecret;
    o.faults_from_env = false;
    auto s = CreateSender(o, src_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // One honest transfer of source blocks 0..3 into blocks 4..7 as transfer `id`.
  absl::Status Honest(KvSender* sender, uint64_t id) {
    const std::vector<int32_t> dst = Range(4, 4);
    receiver_->Expect({id, dst});
    TransferTarget t;
    t.endpoint = receiver_->endpoint();
    t.incarnation = receiver_->incarnation();
    t.transfer_id = id;
    t.dst_blocks = dst;
    t.deadline = absl::Now() + absl::Seconds(20);
    absl::Status s = SendAll(sender, t, Range(0, 4), layout_.num_layers);
    if (!s.ok()) receiver_->CancelAndWait(id);
    for (int64_t l = 0; s.ok() && l < layout_.num_layers; ++l) {
      for (int32_t i = 0; i < 4; ++i) {
        if (!testing::SameRegion(*src_, l, i, *dst_, 4 + i)) s = absl::DataLossError("differs");
      }
    }
    return s;
  }

  LimitHooks hooks_;  // outlives the receiver
  KvLayout layout_;
  std::unique_ptr<FakePool> src_, dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
};

TEST_F(TcpLimitsTest, ConnectionsOverTheCapsAreClosedAtOnce) {
  ReceiverLimits limits;
  limits.max_connections = 6;
  limits.max_connections_per_peer = 3;
  StartReceiver(limits, absl::Seconds(30));
  std::vector<RawPeer> open;
  for (int i = 0; i < 3; ++i) open.push_back(ConnectFrom("127.0.0.1", receiver_->endpoint()));
  for (RawPeer& p : open) EXPECT_TRUE(StaysOpen(p));
  RawPeer fourth = ConnectFrom("127.0.0.1", receiver_->endpoint());
  EXPECT_TRUE(fourth.ClosedWithin(absl::Seconds(2)));
  EXPECT_EQ(hooks_.count(KvRefusal::kPeerConnectionLimit), 1);
  // Other addresses still get in, up to the total.
  for (int i = 0; i < 3; ++i) {
    open.push_back(ConnectFrom(absl::StrCat("127.0.0.", 2 + i), receiver_->endpoint()));
    EXPECT_TRUE(StaysOpen(open.back()));
  }
  RawPeer seventh = ConnectFrom("127.0.0.9", receiver_->endpoint());
  EXPECT_TRUE(seventh.ClosedWithin(absl::Seconds(2)));
  EXPECT_EQ(hooks_.count(KvRefusal::kConnectionLimit), 1);
  EXPECT_EQ(receiver_->stats().connections_refused, 2u);

  // Once they go, an honest sender connects (from 127.0.0.1) and transfers.
  open.clear();
  std::unique_ptr<KvSender> sender = NewSender();
  EXPECT_TRUE(Eventually([&] { return Honest(sender.get(), 1).ok(); }, absl::Seconds(5)));
}

// Each byte of the HELLO in time for io_timeout, but the whole handshake past its deadline:
// cut at the deadline. A stalled AUTH likewise.
TEST_F(TcpLimitsTest, ATrickledHandshakeIsCutAtItsDeadline) {
  StartReceiver(ReceiverLimits(), absl::Milliseconds(600));
  const std::string hello = HelloFrame(layout_);
  RawPeer trickle = RawPeer::Connect(receiver_->endpoint());
  const absl::Time start = absl::Now();
  bool closed = false;
  for (size_t i = 0; i < hello.size() && !closed; ++i) {
    closed = ::send(trickle.fd(), hello.data() + i, 1, MSG_NOSIGNAL) != 1;
    absl::SleepFor(absl::Milliseconds(50));  // 60+ bytes: 3 s for the whole HELLO
    if (absl::Now() - start > absl::Seconds(3)) break;
  }
  EXPECT_TRUE(closed || trickle.ClosedWithin(absl::Seconds(1)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(2500));  // the whole HELLO takes 3 s
  EXPECT_TRUE(Eventually([&] { return hooks_.count(KvRefusal::kHandshakeTimeout) == 1; }));

  RawPeer stall = RawPeer::Connect(receiver_->endpoint());
  stall.SendRaw(hello);
  auto challenge = stall.Read();
  ASSERT_TRUE(challenge.ok()) << challenge.status();
  EXPECT_EQ(challenge->first, FrameType::kChallenge);
  EXPECT_TRUE(stall.ClosedWithin(absl::Seconds(2)));  // no AUTH comes
  EXPECT_TRUE(Eventually([&] { return hooks_.count(KvRefusal::kHandshakeTimeout) == 2; }));
}

// Before the handshake completed a peer may send only small messages: a HELLO claiming
// 16 MiB closes the connection before anything is allocated for it.
TEST_F(TcpLimitsTest, MessagesBeforeTheHandshakeAreSmall) {
  StartReceiver(ReceiverLimits(), absl::Seconds(5));
  std::vector<RawPeer> peers;
  for (int i = 0; i < 8; ++i) {
    peers.push_back(RawPeer::Connect(receiver_->endpoint()));
    wire::Prefix p;
    p.type = FrameType::kHello;
    p.meta_len = 16u << 20;
    std::string raw(wire::kPrefixBytes, '\0');
    wire::EncodePrefix(p, reinterpret_cast<uint8_t*>(raw.data()));
    peers.back().SendRaw(raw + std::string(4096, 'h'));
  }
  for (RawPeer& p : peers) EXPECT_TRUE(p.ClosedWithin(absl::Seconds(2)));
  EXPECT_LE(receiver_->stats().buffer_bytes_peak, 8u * kHandshakeChargeBytes);
  EXPECT_TRUE(Eventually([&] { return receiver_->stats().buffer_bytes == 0; }));
}

// Authenticated peers claiming 16 MiB of metadata each: what does not fit the budget is closed
// unallocated; the budget is never exceeded, an honest sender's transfers go on, and every
// byte charged comes back.
TEST_F(TcpLimitsTest, TheMemoryBudgetBoundsWhatAuthenticatedPeersClaim) {
  ReceiverLimits limits;
  limits.max_connections = 8;
  limits.max_connections_per_peer = 8;
  limits.memory_budget = 8 * kConnectionChargeBytes + (2 << 20);
  StartReceiver(limits, absl::Seconds(5));
  std::unique_ptr<KvSender> sender = NewSender();
  ASSERT_TRUE(Honest(sender.get(), 1).ok());
  const uint64_t honest_charge = receiver_->stats().buffer_bytes;
  EXPECT_EQ(honest_charge, static_cast<uint64_t>(kHandshakeChargeBytes + kConnectionChargeBytes));

  std::vector<RawPeer> claims;
  for (int i = 0; i < 6; ++i) {
    claims.push_back(RawPeer::Connect(receiver_->endpoint()));
    ASSERT_EQ(claims.back().Handshake(layout_, kSecret), receiver_->incarnation());
    wire::Prefix p;
    p.type = FrameType::kBegin;
    p.meta_len = i < 2 ? (768u << 10) : (16u << 20);  // two fit the 2 MiB spare, 16 MiB never
    std::string raw(wire::kPrefixBytes, '\0');
    wire::EncodePrefix(p, reinterpret_cast<uint8_t*>(raw.data()));
    claims.back().SendRaw(raw + std::string(1024, 'm'));  // then nothing: a trickle
  }
  for (int i = 2; i < 6; ++i) EXPECT_TRUE(claims[i].ClosedWithin(absl::Seconds(2))) << i;
  EXPECT_TRUE(StaysOpen(claims[0]));
  EXPECT_TRUE(StaysOpen(claims[1]));
  EXPECT_EQ(hooks_.count(KvRefusal::kMemory), 4);
  EXPECT_LE(receiver_->stats().buffer_bytes_peak, static_cast<uint64_t>(limits.memory_budget));
  ASSERT_TRUE(Honest(sender.get(), 2).ok());  // undisturbed

  claims.clear();
  EXPECT_TRUE(Eventually([&] { return receiver_->stats().buffer_bytes == honest_charge; }));
  ASSERT_TRUE(Honest(sender.get(), 3).ok());
}

TEST_F(TcpLimitsTest, ABudgetTooSmallForTheConnectionCapIsRefused) {
  ReceiverOptions o;
  o.layout = layout_;
  o.limits.max_connections = 100;
  o.limits.memory_budget = 99 * kConnectionChargeBytes;
  auto r = CreateReceiver(o, dst_.get(), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

}  // namespace
}  // namespace tandem::kvtransfer
