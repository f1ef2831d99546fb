// The TCP transport's shared-secret authentication (kvtransfer/auth.h): the HMAC-SHA256
// challenge-response inside the handshake, both ways, and what peers without the secret get.

#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::Range;
using testing::SendAll;
using wire::FrameType;

constexpr char kSecret[] = "0123456789abcdef-the-cluster-secret";
constexpr char kOtherSecret[] = "fedcba9876543210-another-secret";
constexpr absl::Duration kIo = absl::Seconds(5);

absl::Status WriteFrame(int fd, FrameType type, const std::string& meta) {
  const std::string frame = wire::MakeFrame(type, 0, meta);
  return tcp::WriteBytes(fd, frame.data(), frame.size(), kIo);
}

absl::StatusOr<std::pair<FrameType, std::string>> ReadFrame(int fd) {
  uint8_t raw[wire::kPrefixBytes];
  absl::Status s = tcp::ReadBytes(fd, raw, sizeof raw, kIo, kIo);
  if (!s.ok()) return s;
  auto p = wire::DecodePrefix(raw);
  if (!p.ok()) return p.status();
  std::string meta(p->meta_len, '\0');
  s = tcp::ReadBytes(fd, meta.data(), meta.size(), kIo);
  if (!s.ok()) return s;
  return std::make_pair(p->type, meta);
}

// Counts ConnectionRefused by (direction, reason).
class RefusalHooks : public TransferHooks {
 public:
  void TransferStarted(TransferDirection) override {}
  void TransferSucceeded(TransferDirection, double, int64_t, int64_t) override {}
  void TransferFailed(TransferDirection, TransferFailure) override {}
  void ConnectionRefused(TransferDirection d, TransferFailure reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[{d, reason}];
  }
  int count(TransferDirection d, TransferFailure reason) {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[{d, reason}];
  }

 private:
  std::mutex mu_;
  std::map<std::pair<TransferDirection, TransferFailure>, int> counts_;
};

class TcpAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::SmallLayout();
    src_ = std::make_unique<FakePool>(layout_, 32);
    dst_ = std::make_unique<FakePool>(layout_, 32);
    src_->Fill(5);
  }
  void TearDown() override {
    if (receiver_) {
      EXPECT_EQ(receiver_->num_in_flight(), 0);
      EXPECT_TRUE(dst_->GuardsIntact());
    }
  }
  void StartReceiver(const std::string& secret) {
    ReceiverOptions o;
    o.layout = layout_;
    o.secret = secret;
    o.hooks = &receiver_hooks_;
    o.handshake_timeout = absl::Milliseconds(500);
    o.faults_from_env = false;
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  std::unique_ptr<KvSender> NewSender(const std::string& secret) {
    SenderOptions o;
    o.layout = layout_;
    o.secret = secret;
    o.hooks = &sender_hooks_;
    o.faults_from_env = false;
    auto s = CreateSender(o, src_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  TransferTarget Target(uint64_t id, std::vector<int32_t> dst) {
    TransferTarget t;
    t.endpoint = receiver_->endpoint();
    t.incarnation = receiver_->incarnation();
    t.transfer_id = id;
    t.dst_blocks = std::move(dst);
    t.deadline = absl::Now() + absl::Seconds(20);
    return t;
  }
  bool Copied(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (size_t i = 0; i < src.size(); ++i) {
        if (!testing::SameRegion(*src_, l, src[i], *dst_, dst[i])) return false;
      }
    }
    return true;
  }
  bool AllZero() {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < 32; ++b) {
        if (!dst_->IsZero(l, b)) return false;
      }
    }
    return true;
  }
  // A whole transfer of source blocks 8..11 into blocks 4 * id.. (expected first).
  absl::Status TryTransfer(KvSender* sender, uint64_t id) {
    const std::vector<int32_t> dst = Range(4 * static_cast<int32_t>(id), 4);
    receiver_->Expect({id, dst});
    absl::Status s = SendAll(sender, Target(id, dst), Range(8, 4), layout_.num_layers);
    if (!s.ok()) receiver_->CancelAndWait(id);
    return s;
  }

  RefusalHooks receiver_hooks_, sender_hooks_;  // outlive the transports below
  KvLayout layout_;
  std::unique_ptr<FakePool> src_, dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
};

TEST_F(TcpAuthTest, TheRightSecretConnectsAndTransfersBitExact) {
  StartReceiver(kSecret);
  auto sender = NewSender(kSecret);
  ASSERT_TRUE(TryTransfer(sender.get(), 1).ok());
  EXPECT_TRUE(completions_.WaitFor(1, 0).status.ok());
  EXPECT_TRUE(Copied(Range(8, 4), Range(4, 4)));
  EXPECT_EQ(sender->stats().connects, 1u);
  EXPECT_EQ(receiver_->stats().connects, 1u);
  EXPECT_EQ(receiver_->stats().handshakes_refused, 0u);
}

TEST_F(TcpAuthTest, AWrongSecretIsRefusedAtConnectTimeAndOthersKeepWorking) {
  StartReceiver(kSecret);
  auto good = NewSender(kSecret);
  // A transfer of the good sender is open while the bad one is refused.
  receiver_->Expect({1, Range(0, 4)});
  auto h = good->Begin(Target(1, Range(0, 4)), Range(8, 4));
  ASSERT_TRUE(h.ok()) << h.status();
  good->SendLayer(*h, 0);

  auto bad = NewSender(kOtherSecret);
  absl::Status s = TryTransfer(bad.get(), 2);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("refused the connection"), std::string::npos) << s;
  EXPECT_NE(s.message().find("does not match this receiver's shared secret"), std::string::npos)
      << s;
  EXPECT_EQ(bad->stats().connects, 0u);
  EXPECT_EQ(receiver_->stats().handshakes_refused, 1u);
  EXPECT_EQ(receiver_hooks_.count(TransferDirection::kReceive, TransferFailure::kUnauthenticated),
            1);
  // The receiver refused it, not the sender.
  EXPECT_EQ(sender_hooks_.count(TransferDirection::kSend, TransferFailure::kUnauthenticated), 0);

  for (int64_t l = 1; l < layout_.num_layers; ++l) good->SendLayer(*h, l);
  testing::Done done;
  good->Finish(*h, "", done.Callback());
  ASSERT_TRUE(done.Wait().ok());
  EXPECT_TRUE(Copied(Range(8, 4), Range(0, 4)));
  // And the refused one's second try is refused the same way (a fresh handshake each time).
  s = TryTransfer(bad.get(), 3);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(receiver_->stats().handshakes_refused, 2u);
}

TEST_F(TcpAuthTest, ASenderWithoutASecretIsRefused) {
  StartReceiver(kSecret);
  auto sender = NewSender("");
  absl::Status s = TryTransfer(sender.get(), 1);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("the sender has no shared secret"), std::string::npos) << s;
  EXPECT_TRUE(AllZero());
  EXPECT_EQ(receiver_->stats().handshakes_refused, 1u);
  EXPECT_EQ(receiver_->stats().connects, 0u);
}

TEST_F(TcpAuthTest, ASenderWithASecretRefusesAReceiverWithout) {
  StartReceiver("");
  auto sender = NewSender(kSecret);
  absl::Status s = TryTransfer(sender.get(), 1);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("failed authentication"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no shared secret configured there"), std::string::npos) << s;
  EXPECT_EQ(sender->stats().connects, 0u);
  EXPECT_EQ(sender->stats().handshakes_refused, 1u);
  EXPECT_TRUE(AllZero());
  EXPECT_EQ(sender_hooks_.count(TransferDirection::kSend, TransferFailure::kUnauthenticated), 1);
  EXPECT_EQ(receiver_hooks_.count(TransferDirection::kReceive, TransferFailure::kUnauthenticated),
            0);  // it accepted: the sender refused
}

TEST_F(TcpAuthTest, WithoutSecretsOnBothSidesNothingChanges) {
  StartReceiver("");
  auto sender = NewSender("");
  ASSERT_TRUE(TryTransfer(sender.get(), 1).ok());
  EXPECT_TRUE(Copied(Range(8, 4), Range(4, 4)));
}

TEST_F(TcpAuthTest, ALayoutMismatchIsStillRefusedNamingTheField) {
  StartReceiver(kSecret);
  layout_.block_size = 8;  // the sender's layout only
  auto sender = NewSender(kSecret);
  absl::Status s = TryTransfer(sender.get(), 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("block_size"), std::string::npos) << s;
  EXPECT_EQ(receiver_hooks_.count(TransferDirection::kReceive, TransferFailure::kIncompatible), 1);
  EXPECT_EQ(receiver_hooks_.count(TransferDirection::kReceive, TransferFailure::kUnauthenticated),
            0);
}

TEST_F(TcpAuthTest, AProofForAnotherChallengeIsRefused) {
  StartReceiver(kSecret);
  auto fd = tcp::Connect(receiver_->endpoint(), kIo);
  ASSERT_TRUE(fd.ok()) << fd.status();
  wire::Hello hello;
  hello.layout = layout_;
  const std::string hello_meta = wire::EncodeHello(hello);
  ASSERT_TRUE(WriteFrame(fd->get(), FrameType::kHello, hello_meta).ok());
  auto challenge = ReadFrame(fd->get());
  ASSERT_TRUE(challenge.ok()) << challenge.status();
  ASSERT_EQ(challenge->first, FrameType::kChallenge);
  wire::Challenge c;
  ASSERT_TRUE(wire::DecodeChallenge(challenge->second, &c).ok());
  EXPECT_EQ(c.nonce.size(), kAuthNonceBytes);
  // A replayed proof: right secret, but computed for a nonce of an earlier connection.
  wire::Auth auth;
  auth.nonce = std::string(kAuthNonceBytes, 's');
  auth.proof = SenderProof(kSecret, std::string(kAuthNonceBytes, 'r'), auth.nonce, hello_meta);
  ASSERT_TRUE(WriteFrame(fd->get(), FrameType::kAuth, wire::EncodeAuth(auth)).ok());
  auto refuse = ReadFrame(fd->get());
  ASSERT_TRUE(refuse.ok()) << refuse.status();
  ASSERT_EQ(refuse->first, FrameType::kRefuse);
  wire::Outcome o;
  ASSERT_TRUE(wire::DecodeOutcome(refuse->second, &o).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(o.status)) << o.status;
  EXPECT_FALSE(ReadFrame(fd->get()).ok());  // then closed
}

// A receiver that does not know the secret but plays along: it challenges, then answers with
// `proof(sender_nonce, receiver_nonce, auth)`.
class FakeReceiver {
 public:
  explicit FakeReceiver(const KvLayout& layout,
                        std::function<std::string(const wire::Auth&, const std::string&)> proof,
                        size_t nonce_bytes = kAuthNonceBytes)
      : layout_(layout), proof_(std::move(proof)), nonce_bytes_(nonce_bytes) {
    auto fd = tcp::Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(fd.ok()) << fd.status();
    listen_ = std::move(*fd);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeReceiver() { Join(); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  // Whether it got as far as its WELCOME (waits for its connection to end).
  bool sent_welcome() {
    Join();
    return sent_welcome_;
  }

 private:
  void Serve() {
    int fd = -1;
    for (int i = 0; i < 500 && fd < 0; ++i) {
      fd = accept(listen_.get(), nullptr, nullptr);
      if (fd < 0) absl::SleepFor(absl::Milliseconds(10));
    }
    if (fd < 0) return;
    tcp::Fd conn(fd);
    auto hello = ReadFrame(conn.get());
    if (!hello.ok()) return;
    const std::string nonce(nonce_bytes_, 'n');
    if (!WriteFrame(conn.get(), FrameType::kChallenge, wire::EncodeChallenge({nonce})).ok()) return;
    auto auth_frame = ReadFrame(conn.get());
    if (!auth_frame.ok()) return;
    wire::Auth auth;
    if (!wire::DecodeAuth(auth_frame->second, &auth).ok()) return;
    wire::Welcome welcome;
    welcome.incarnation = 7;
    welcome.layout = layout_;
    welcome.proof = proof_(auth, nonce);
    sent_welcome_ = WriteFrame(conn.get(), FrameType::kWelcome, wire::EncodeWelcome(welcome)).ok();
    ReadFrame(conn.get()).IgnoreError();  // until the sender hangs up
  }

  void Join() {
    listen_.Shutdown();
    if (thread_.joinable()) thread_.join();
  }

  KvLayout layout_;
  std::function<std::string(const wire::Auth&, const std::string&)> proof_;
  size_t nonce_bytes_;
  int port_ = 0;
  tcp::Fd listen_;
  std::thread thread_;
  std::atomic<bool> sent_welcome_{false};
};

TEST_F(TcpAuthTest, ASenderRefusesAReceiverThatCannotProveTheSecret) {
  const std::vector<
      std::pair<std::string, std::function<std::string(const wire::Auth&, const std::string&)>>>
      fakes = {
          {"random proof",
           [](const wire::Auth&, const std::string&) { return std::string(kAuthMacBytes, 'x'); }},
          {"no proof", [](const wire::Auth&, const std::string&) { return std::string(); }},
          // The sender's own proof reflected back: the labels tell the directions apart.
          {"reflected proof", [](const wire::Auth& a, const std::string&) { return a.proof; }},
          {"another secret",
           [this](const wire::Auth& a, const std::string& nonce) {
             wire::Welcome w;
             w.incarnation = 7;
             w.layout = layout_;
             return ReceiverProof(kOtherSecret, a.nonce, nonce, wire::EncodeWelcome(w));
           }},
      };
  for (const auto& [name, proof] : fakes) {
    FakeReceiver fake(layout_, proof);
    auto sender = NewSender(kSecret);
    TransferTarget t;
    t.endpoint = fake.endpoint();
    t.incarnation = 7;
    t.transfer_id = 1;
    t.dst_blocks = Range(0, 4);
    auto h = sender->Begin(t, Range(8, 4));
    ASSERT_FALSE(h.ok()) << name;
    EXPECT_TRUE(absl::IsUnauthenticated(h.status())) << name << ": " << h.status();
    EXPECT_NE(h.status().message().find("its proof of the shared secret is wrong"),
              std::string::npos)
        << name << ": " << h.status();
    EXPECT_TRUE(fake.sent_welcome()) << name;
    EXPECT_EQ(sender->stats().connects, 0u) << name;
  }
  EXPECT_EQ(sender_hooks_.count(TransferDirection::kSend, TransferFailure::kUnauthenticated),
            static_cast<int>(fakes.size()));
}

TEST_F(TcpAuthTest, AChallengeWithoutAFullNonceIsRefused) {
  // An empty challenge would let a fake receiver collect proofs it chose the input of.
  for (size_t bytes : {size_t{0}, size_t{8}}) {
    FakeReceiver fake(
        layout_, [](const wire::Auth&, const std::string&) { return std::string(); }, bytes);
    auto sender = NewSender(kSecret);
    TransferTarget t;
    t.endpoint = fake.endpoint();
    t.incarnation = 7;
    t.transfer_id = 1;
    t.dst_blocks = Range(0, 4);
    auto h = sender->Begin(t, Range(8, 4));
    ASSERT_FALSE(h.ok()) << bytes;
    EXPECT_TRUE(absl::IsUnauthenticated(h.status())) << h.status();
    EXPECT_NE(h.status().message().find("its challenge has a nonce of"), std::string::npos)
        << h.status();
    EXPECT_FALSE(fake.sent_welcome()) << bytes;  // the sender sent no AUTH: nothing to answer
  }
}

TEST_F(TcpAuthTest, AFakeReceiverThatKnowsTheSecretIsAccepted) {
  // The control case for the test above: the same fake, proving the secret, gets through.
  FakeReceiver fake(layout_, [this](const wire::Auth& a, const std::string& nonce) {
    wire::Welcome w;
    w.incarnation = 7;
    w.layout = layout_;
    return ReceiverProof(kSecret, a.nonce, nonce, wire::EncodeWelcome(w));
  });
  auto sender = NewSender(kSecret);
  TransferTarget t;
  t.endpoint = fake.endpoint();
  t.incarnation = 7;
  t.transfer_id = 1;
  t.dst_blocks = Range(0, 4);
  auto h = sender->Begin(t, Range(8, 4));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(sender->stats().connects, 1u);
  sender->Abort(*h);
}

TEST(KvAuthTest, ProofsDependOnSecretNoncesMessageAndDirection) {
  const std::string a(kAuthNonceBytes, 'a'), b(kAuthNonceBytes, 'b');
  const std::string p = SenderProof(kSecret, a, b, "hello");
  EXPECT_EQ(p.size(), kAuthMacBytes);
  EXPECT_EQ(p, SenderProof(kSecret, a, b, "hello"));
  EXPECT_NE(p, SenderProof(kOtherSecret, a, b, "hello"));
  EXPECT_NE(p, SenderProof(kSecret, b, a, "hello"));
  EXPECT_NE(p, SenderProof(kSecret, a, b, "hellO"));
  EXPECT_NE(p, ReceiverProof(kSecret, a, b, "hello"));
  EXPECT_TRUE(ProofMatches(p, p));
  EXPECT_FALSE(ProofMatches(p.substr(1), p));
  EXPECT_FALSE(ProofMatches("", ""));
  auto n1 = NewNonce(), n2 = NewNonce();
  ASSERT_TRUE(n1.ok() && n2.ok());
  EXPECT_EQ(n1->size(), kAuthNonceBytes);
  EXPECT_NE(*n1, *n2);
}

TEST(KvAuthTest, SecretFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/kv_secret_good", short_one = dir + "/kv_secret_short";
  std::ofstream(good) << kSecret << "\n";
  std::ofstream(short_one) << "tooshort\n";
  auto s = ReadSecretFile(good);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, kSecret);  // the trailing newline is not part of it
  s = ReadSecretFile(short_one);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("at least 16"), std::string::npos) << s.status();
  s = ReadSecretFile(dir + "/no_such_kv_secret");
  EXPECT_TRUE(absl::IsNotFound(s.status())) << s.status();
  std::remove(good.c_str());
  std::remove(short_one.c_str());
}

TEST(KvAuthTest, OnlyTheTcpTransportTakesASecret) {
  KvLayout layout = testing::SmallLayout();
  FakePool pool(layout, 4);
  SenderOptions so;
  so.transport = "loopback";
  so.layout = layout;
  so.secret = kSecret;
  auto sender = CreateSender(so, &pool);
  EXPECT_TRUE(absl::IsInvalidArgument(sender.status())) << sender.status();
  ReceiverOptions ro;
  ro.transport = "loopback";
  ro.layout = layout;
  ro.secret = kSecret;
  auto receiver = CreateReceiver(ro, &pool, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(receiver.status())) << receiver.status();
}

}  // namespace
}  // namespace tandem::kvtransfer
