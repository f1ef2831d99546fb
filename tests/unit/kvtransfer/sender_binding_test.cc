// A transfer's data is accepted only from the sender named for it (README.md, "Transfer ids and
// the sender binding"): a BEGIN must prove the transfer's key, the attempt then belongs to the
// connection it began on, and everything a sender that proved nothing hears is one NOT_FOUND
// that tells nothing about the transfer. Over tcp (real sockets, with the shared secret: the
// attacker is authenticated) and loopback, then hand-written tcp peers.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/cluster/transfer_key.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"
#include "tests/unit/kvtransfer/raw_peer.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::Range;
using testing::RawPeer;
using testing::SendAll;
using wire::FrameType;

constexpr char kSecret[] = "0123456789abcdef-the-cluster-secret";

std::string Key(char c) { return std::string(kTransferKeyBytes, c); }

class SenderBindingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    src_ = std::make_unique<FakePool>(layout_, 16);
    other_src_ = std::make_unique<FakePool>(layout_, 16);
    dst_ = std::make_unique<FakePool>(layout_, 16);
    src_->Fill(3);
    other_src_->Fill(99);
    ReceiverOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.secret = tcp() ? kSecret : "";
    o.faults_from_env = false;
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  void TearDown() override {
    EXPECT_EQ(receiver_->num_in_flight(), 0);
    EXPECT_TRUE(dst_->GuardsIntact());
  }
  bool tcp() const { return GetParam() == "tcp"; }
  std::unique_ptr<KvSender> NewSender(FakePool* pool) {
    SenderOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.secret = tcp() ? kSecret : "";
    o.faults_from_env = false;
    auto s = CreateSender(o, pool);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // The target the router names a sender for: `key` is the transfer's key, of which the sender
  // gets `attempt`'s key (TransferAttemptKey) unless `attempt_key` is given.
  TransferTarget Target(uint64_t id, uint32_t attempt, std::vector<int32_t> dst, std::string key,
                        std::optional<std::string> attempt_key = std::nullopt) {
    TransferTarget t;
    t.endpoint = receiver_->endpoint();
    t.incarnation = receiver_->incarnation();
    t.transfer_id = id;
    t.attempt = attempt;
    t.dst_blocks = std::move(dst);
    t.deadline = absl::Now() + absl::Seconds(20);
    t.transfer_key = attempt_key.value_or(TransferAttemptKey(key, attempt));
    return t;
  }
  bool Copied(FakePool* from, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (size_t i = 0; i < src.size(); ++i) {
        if (!testing::SameRegion(*from, l, src[i], *dst_, dst[i])) return false;
      }
    }
    return true;
  }
  bool AllZero() {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < 16; ++b) {
        if (!dst_->IsZero(l, b)) return false;
      }
    }
    return true;
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> src_, other_src_, dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
};

// A KV injection attempt with everything but the key: the transfer's id, incarnation and
// blocks, and a higher attempt, from a sender that passed the handshake. It lands nothing, the
// named sender is not made stale, and its transfer completes bit-exact.
TEST_P(SenderBindingTest, AnUnnamedSenderWithEverythingButTheKeyLandsNothing) {
  const std::vector<int32_t> dst = {5, 2, 9};
  receiver_->Expect({41, dst, {}, 0, Key('k')});
  std::unique_ptr<KvSender> intruder = NewSender(other_src_.get());
  for (const std::string& key : {std::string(), Key('x')}) {  // no key, a wrong one
    absl::Status s = SendAll(intruder.get(), Target(41, 7, dst, key), Range(0, 3),
                             layout_.num_layers, "not the named sender's tokens");
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    for (const char* disclosure : {"expects", "block 5", "block 2", "attempt 0", "blocks"}) {
      EXPECT_EQ(s.message().find(disclosure), std::string::npos) << s;
    }
  }
  EXPECT_TRUE(AllZero());
  EXPECT_GE(receiver_->stats().messages_refused, 2u);
  EXPECT_EQ(completions_.size(), 0u);  // no attempt began, none ended

  std::unique_ptr<KvSender> named = NewSender(src_.get());
  ASSERT_TRUE(
      SendAll(named.get(), Target(41, 0, dst, Key('k')), {1, 2, 3}, layout_.num_layers, "t").ok());
  const CompletedTransfer done = completions_.WaitFor(41, 0);
  ASSERT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.trailer, "t");
  EXPECT_TRUE(Copied(src_.get(), {1, 2, 3}, dst));
}

// The key is per attempt: the sender named for attempt 0 (which holds attempt 0's key) can begin
// no other attempt (a later one would make the sender named next stale), nor can the transfer's
// own key, which only the decode worker and the router hold, be used as a sender's key. The
// sender the router names for attempt 1 then lands bit-exact.
TEST_P(SenderBindingTest, AnAttemptsKeyBeginsNoOtherAttempt) {
  const std::vector<int32_t> dst = {6, 1};
  receiver_->Expect({43, dst, {}, 0, Key('k')});
  const std::string key0 = TransferAttemptKey(Key('k'), 0);
  ASSERT_EQ(key0.size(), kTransferKeyBytes);
  EXPECT_NE(key0, TransferAttemptKey(Key('k'), 1));
  EXPECT_NE(key0, Key('k'));
  std::unique_ptr<KvSender> earlier = NewSender(other_src_.get());
  for (uint32_t attempt : {1u, 2u, 7u}) {
    absl::Status s = SendAll(earlier.get(), Target(43, attempt, dst, Key('k'), key0), Range(0, 2),
                             layout_.num_layers, "from the sender of attempt 0");
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << attempt << ": " << s;
  }
  absl::Status s = SendAll(earlier.get(), Target(43, 1, dst, Key('k'), Key('k')), Range(0, 2),
                           layout_.num_layers, "with the transfer's own key");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(AllZero());
  EXPECT_EQ(completions_.size(), 0u);

  std::unique_ptr<KvSender> named = NewSender(src_.get());
  ASSERT_TRUE(
      SendAll(named.get(), Target(43, 1, dst, Key('k')), {4, 7}, layout_.num_layers, "t1").ok());
  const CompletedTransfer done = completions_.WaitFor(43, 1);
  ASSERT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.trailer, "t1");
  EXPECT_TRUE(Copied(src_.get(), {4, 7}, dst));
}

// An unknown transfer and a known one without the key get the same answer.
TEST_P(SenderBindingTest, RefusalsDoNotTellWhetherATransferExists) {
  receiver_->Expect({7, {1, 2}, {}, 0, Key('k')});
  std::unique_ptr<KvSender> intruder = NewSender(other_src_.get());
  absl::Status known =
      SendAll(intruder.get(), Target(7, 3, {1, 2}, Key('y')), {0, 1}, layout_.num_layers);
  absl::Status unknown =
      SendAll(intruder.get(), Target(8, 3, {1, 2}, Key('y')), {0, 1}, layout_.num_layers);
  EXPECT_EQ(known.code(), absl::StatusCode::kNotFound) << known;
  EXPECT_EQ(unknown.code(), known.code()) << unknown;
  std::string k(known.message()), u(unknown.message());
  const size_t at = k.find("transfer 7 attempt 3");
  ASSERT_NE(at, std::string::npos) << k;
  k.replace(at, 20, "transfer 8 attempt 3");
  EXPECT_EQ(k, u);
  receiver_->CancelAndWait(7);
}

// The named sender hears the details it needs: a stale attempt names the live one.
TEST_P(SenderBindingTest, TheNamedSenderIsToldWhatIsWrong) {
  receiver_->Expect({9, {4, 5}, {}, 0, Key('k')});
  std::unique_ptr<KvSender> named = NewSender(src_.get());
  absl::Status s = SendAll(named.get(), Target(9, 0, {4, 6}, Key('k')), {0, 1}, layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("expects block 5"), std::string::npos) << s;
  receiver_->CancelAndWait(9);
}

INSTANTIATE_TEST_SUITE_P(Transports, SenderBindingTest, ::testing::Values("tcp", "loopback"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------- hand-written tcp peers

class RawBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    dst_ = std::make_unique<FakePool>(layout_, 16);
    ReceiverOptions o;
    o.layout = layout_;
    o.secret = kSecret;
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
  // No RESULT within a short while: the message was taken (or ignored) silently.
  static bool Silent(RawPeer& p) {
    auto m = p.Read(absl::Milliseconds(200));
    return !m.ok() && absl::IsDeadlineExceeded(m.status());
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
};

// Another authenticated connection can neither write into, finish, abort, nor supersede the
// attempt the named sender began; a proof seen on the wire does not work on another connection.
TEST_F(RawBindingTest, AnotherConnectionCannotDriveTheLiveAttempt) {
  const std::string key = Key('k');
  receiver_->Expect({5, {3, 4}, {}, 0, key});
  RawPeer named = RawPeer::Connect(receiver_->endpoint());
  RawPeer other = RawPeer::Connect(receiver_->endpoint());
  const uint64_t inc = named.Handshake(layout_, kSecret);
  ASSERT_EQ(inc, receiver_->incarnation());
  ASSERT_EQ(other.Handshake(layout_, kSecret), inc);
  named.Begin(5, 0, inc, {3, 4}, key);
  EXPECT_TRUE(Silent(named));  // begun

  other.SendData(5, 0, 0, {3, 4}, Payload(2, '\xee'));  // the live attempt's ids
  EXPECT_EQ(other.ReadResult().code(), absl::StatusCode::kNotFound);
  other.Send(FrameType::kFinish, wire::EncodeFinish({5, 0, 4, 8 * layout_.region_bytes(), "x"}));
  other.Send(FrameType::kAbort, wire::EncodeOutcome({5, 0, absl::AbortedError("stop")}));
  other.Begin(5, 1, inc, {3, 4});  // a higher attempt without the key
  EXPECT_EQ(other.ReadResult().code(), absl::StatusCode::kNotFound);
  // The named sender's proof, replayed on another connection (another binding).
  wire::Begin replay{5, 2, inc, -1, {3, 4}};
  replay.proof = BeginProof(key, named.binding(), 5, 2, {3, 4});
  other.Send(FrameType::kBegin, wire::EncodeBegin(replay));
  EXPECT_EQ(other.ReadResult().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(dst_->IsZero(0, 3) && dst_->IsZero(0, 4));
  EXPECT_GE(receiver_->stats().messages_refused, 3u);

  for (uint32_t l = 0; l < layout_.num_layers; ++l) {
    named.SendData(5, 0, l, {3, 4}, Payload(1, 'a') + Payload(1, 'b'));
  }
  named.Send(FrameType::kFinish,
             wire::EncodeFinish({5, 0, 4, 8 * layout_.region_bytes(), "named"}));
  EXPECT_TRUE(named.ReadResult().ok());
  const CompletedTransfer done = completions_.WaitFor(5, 0);
  ASSERT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.trailer, "named");
  EXPECT_EQ(dst_->Region(3, 3)[0], 'a');
  EXPECT_EQ(dst_->Region(3, 4)[0], 'b');
}

// The layout is checked only once the peer proved the secret: a peer without it learns
// nothing of the receiver's (and one with it gets the field that differs).
TEST_F(RawBindingTest, NoLayoutDisclosedBeforeTheSecretIsProven) {
  KvLayout wrong = layout_;
  wrong.num_kv_heads += 1;
  wrong.model_id = "guess";
  RawPeer stranger = RawPeer::Connect(receiver_->endpoint());
  absl::Status refused;
  EXPECT_EQ(stranger.Handshake(wrong, "", &refused), 0u);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  for (const char* disclosure : {"layout", "model", "heads", "local"}) {
    EXPECT_EQ(refused.message().find(disclosure), std::string::npos) << refused;
  }
  RawPeer member = RawPeer::Connect(receiver_->endpoint());
  EXPECT_EQ(member.Handshake(wrong, kSecret, &refused), 0u);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("kv layout mismatch in model_id"), std::string::npos) << refused;
}

TEST(TransferIdsTest, RandomAndUnrelated) {
  std::set<uint64_t> ids;
  std::set<std::string> keys;
  uint64_t all_or = 0, all_and = ~0ull;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<uint64_t> id = NewTransferId();
    absl::StatusOr<std::string> key = NewTransferKey();
    ASSERT_TRUE(id.ok() && key.ok());
    EXPECT_NE(*id, 0u);
    EXPECT_EQ(key->size(), kTransferKeyBytes);
    ids.insert(*id);
    keys.insert(*key);
    all_or |= *id;
    all_and &= *id;
  }
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(keys.size(), 1000u);
  EXPECT_EQ(all_or, ~0ull);  // every bit varies: no fixed salt, no counter in the low bits only
  EXPECT_EQ(all_and, 0u);
}

}  // namespace
}  // namespace tandem::kvtransfer
