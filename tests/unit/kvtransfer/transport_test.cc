// Behaviour every transport shares, run over real sockets (tcp) and in-process (loopback).

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::Done;
using testing::FakePool;
using testing::Range;
using testing::SendAll;

KvLayout MidLayout() {
  KvLayout l;
  l.model_id = "llama-test";
  l.num_layers = 8;
  l.num_kv_heads = 4;
  l.head_dim = 16;
  l.block_size = 4;
  l.kv_dtype = DType::kBF16;  // region = 1 KiB
  return l;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    layout_ = MidLayout();
    src_ = std::make_unique<FakePool>(layout_, 128);
    dst_ = std::make_unique<FakePool>(layout_, 128);
    src_->Fill(1);
    StartReceiver();
  }
  void TearDown() override {
    if (sender_) {
      EXPECT_EQ(sender_->num_in_flight(), 0);
    }
    if (receiver_) {
      EXPECT_EQ(receiver_->num_in_flight(), 0);
      EXPECT_TRUE(dst_->GuardsIntact());
    }
    sender_.reset();
    receiver_.reset();
  }

  ReceiverOptions ReceiverOpts() {
    ReceiverOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.faults_from_env = false;
    return o;
  }
  SenderOptions SenderOpts() {
    SenderOptions o;
    o.transport = GetParam();
    o.layout = layout_;
    o.max_message_bytes = 8 << 10;  // several messages per layer
    o.faults_from_env = false;
    return o;
  }
  void StartReceiver(ReceiverOptions o) {
    auto r = CreateReceiver(o, dst_.get(), completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }
  void StartReceiver() { StartReceiver(ReceiverOpts()); }
  KvSender* Sender(SenderOptions o) {
    auto s = CreateSender(o, src_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
    return sender_.get();
  }
  KvSender* Sender() { return Sender(SenderOpts()); }

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
  void ExpectCopied(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (size_t i = 0; i < src.size(); ++i) {
        ASSERT_TRUE(testing::SameRegion(*src_, l, src[i], *dst_, dst[i]))
            << "layer " << l << " src " << src[i] << " dst " << dst[i];
      }
    }
  }
  std::string UnreachableEndpoint() {
    if (GetParam() == "loopback") return "nobody-listens-here";
    int port = 0;
    auto fd = tcp::Listen("127.0.0.1", 0, &port);  // bound, then closed: nobody listens
    return "127.0.0.1:" + std::to_string(port);
  }

  KvLayout layout_;
  std::unique_ptr<FakePool> src_, dst_;
  Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_P(TransportTest, ManyLayersAndBlocksArriveBitExact) {
  KvSender* sender = Sender();
  std::vector<int32_t> src = Range(0, 100), dst = Range(10, 100);
  std::mt19937 rng(7);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  receiver_->Expect({42, dst});
  EXPECT_EQ(receiver_->num_in_flight(), 1);
  ASSERT_TRUE(SendAll(sender, Target(42, dst), src, layout_.num_layers, "trailer-bytes").ok());
  CompletedTransfer c = completions_.WaitFor(42, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "trailer-bytes");
  ExpectCopied(src, dst);
  for (int32_t b : Range(0, 10)) EXPECT_TRUE(dst_->IsZero(0, b)) << b;  // outside: untouched
  for (int32_t b : Range(110, 18)) EXPECT_TRUE(dst_->IsZero(7, b)) << b;
  TransportStats ss = sender->stats(), rs = receiver_->stats();
  EXPECT_EQ(ss.transfers_ok, 1u);
  EXPECT_EQ(rs.transfers_ok, 1u);
  EXPECT_EQ(ss.bytes, 100u * 8 * 1024);
  EXPECT_EQ(rs.bytes, ss.bytes);
  EXPECT_EQ(rs.frames, ss.frames);
  EXPECT_GT(ss.frames, 8u);
}

// A decode worker reports how long it waited for its KV (the TTFT split): the completion says
// so, from Expect to the verified transfer, on the receiver's clock.
TEST_P(TransportTest, TheCompletionSaysHowLongTheReceiverWaited) {
  KvSender* sender = Sender();
  const std::vector<int32_t> blocks = Range(0, 4);
  const absl::Time expected = absl::Now();
  receiver_->Expect({43, blocks});
  absl::SleepFor(absl::Milliseconds(120));  // the prefill worker computing
  ASSERT_TRUE(SendAll(sender, Target(43, blocks), blocks, layout_.num_layers, "t").ok());
  CompletedTransfer c = completions_.WaitFor(43, 0);
  const absl::Duration elapsed = absl::Now() - expected;
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_GE(c.waited, absl::Milliseconds(120));
  EXPECT_LE(c.waited, elapsed);
}

TEST_P(TransportTest, HandshakeMismatchIsRefusedNamingTheField) {
  struct Case {
    const char* field;
    void (*mutate)(KvLayout*);
  };
  const Case cases[] = {
      {"model_id", [](KvLayout* l) { l->model_id = "other-model"; }},
      {"num_layers", [](KvLayout* l) { l->num_layers = 7; }},
      {"num_kv_heads", [](KvLayout* l) { l->num_kv_heads = 2; }},
      {"head_dim", [](KvLayout* l) { l->head_dim = 32; }},
      {"block_size", [](KvLayout* l) { l->block_size = 16; }},
      {"kv_dtype", [](KvLayout* l) { l->kv_dtype = DType::kF8E4M3; }},
      {"protocol_version",
       [](KvLayout* l) { l->protocol_version = kKvTransferProtocolVersion + 1; }},
  };
  receiver_->Expect({1, {0}});
  for (const Case& c : cases) {
    SenderOptions o = SenderOpts();
    c.mutate(&o.layout);
    FakePool pool(o.layout, 4);
    auto sender = CreateSender(o, &pool);
    ASSERT_TRUE(sender.ok());
    absl::StatusOr<TransferHandle> h = (*sender)->Begin(Target(1, {0}), {0});
    ASSERT_FALSE(h.ok()) << c.field;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
    EXPECT_NE(h.status().message().find(c.field), std::string::npos) << h.status();
    EXPECT_EQ((*sender)->num_in_flight(), 0);
  }
  EXPECT_EQ(receiver_->stats().handshakes_refused, 7u);
  receiver_->CancelAndWait(1);
}

TEST_P(TransportTest, StaleIncarnationAndUnreachableFailFast) {
  KvSender* sender = Sender();
  receiver_->Expect({5, {3}});
  TransferTarget t = Target(5, {3});
  t.incarnation += 1;
  absl::StatusOr<TransferHandle> h = sender->Begin(t, {3});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("incarnation"), std::string::npos);
  t = Target(5, {3});
  t.endpoint = UnreachableEndpoint();
  h = sender->Begin(t, {3});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable) << h.status();
  // Mismatched lists, bad source ids and past deadlines are refused locally.
  EXPECT_EQ(sender->Begin(Target(5, {3, 4}), {3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender->Begin(Target(5, {3}), {1000}).status().code(),
            absl::StatusCode::kInvalidArgument);
  t = Target(5, {3});
  t.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(sender->Begin(t, {3}).status().code(), absl::StatusCode::kDeadlineExceeded);
  receiver_->CancelAndWait(5);
}

TEST_P(TransportTest, LayerwiseTransfersInterleaveOnOneConnection) {
  KvSender* sender = Sender();
  const int kTransfers = 3;
  std::vector<TransferHandle> handles;
  for (int i = 0; i < kTransfers; ++i) {
    receiver_->Expect({100u + i, Range(i * 20, 20)});
    auto h = sender->Begin(Target(100 + i, Range(i * 20, 20)), Range(60 + i * 20, 20));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  // Layer l of every transfer, as layers of concurrent prefills finish.
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    for (TransferHandle h : handles) sender->SendLayer(h, l);
  }
  std::vector<Done> done(kTransfers);
  for (int i = kTransfers - 1; i >= 0; --i) sender->Finish(handles[i], "", done[i].Callback());
  for (int i = 0; i < kTransfers; ++i) {
    ASSERT_TRUE(done[i].Wait().ok()) << i;
    ASSERT_TRUE(completions_.WaitFor(100 + i, 0).status.ok());
    ExpectCopied(Range(60 + i * 20, 20), Range(i * 20, 20));
  }
  EXPECT_EQ(sender->stats().connects, 1u);  // one connection, multiplexed
}

TEST_P(TransportTest, SendLayerDoesNotBlockTheCaller) {
  SenderOptions o = SenderOpts();
  o.faults.kv_delay_ms = 20;  // every message takes 20 ms: the transfer takes >= 320 ms
  KvSender* sender = Sender(o);
  receiver_->Expect({9, Range(0, 16)});
  auto h = sender->Begin(Target(9, Range(0, 16)), Range(0, 16));
  ASSERT_TRUE(h.ok());
  const absl::Time start = absl::Now();
  for (int64_t l = 0; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  Done done;
  sender->Finish(*h, "", done.Callback());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(done.Wait().ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  ASSERT_TRUE(completions_.WaitFor(9, 0).status.ok());
}

TEST_P(TransportTest, UnknownTransferIsRejectedAndWritesNothing) {
  KvSender* sender = Sender();
  absl::Status s = SendAll(sender, Target(77, Range(0, 16)), Range(0, 16), layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    for (int32_t b = 0; b < 128; ++b) ASSERT_TRUE(dst_->IsZero(l, b));
  }
}

TEST_P(TransportTest, ForeignBlockIdsAreRejectedAndWriteNothing) {
  KvSender* sender = Sender();
  receiver_->Expect({8, {1, 2, 3}});
  absl::Status s = SendAll(sender, Target(8, {1, 2, 99}), {4, 5, 6}, layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("99"), std::string::npos) << s;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    for (int32_t b = 0; b < 128; ++b) ASSERT_TRUE(dst_->IsZero(l, b));
  }
  // The reservation survives a bad sender: a correct retry fills it.
  ASSERT_TRUE(SendAll(sender, Target(8, {1, 2, 3}, 1), {4, 5, 6}, layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(8, 1).status.ok());
  ExpectCopied({4, 5, 6}, {1, 2, 3});
}

TEST_P(TransportTest, CorruptionIsDetectedOnBothSidesAndARetrySucceeds) {
  SenderOptions o = SenderOpts();
  o.faults.kv_corrupt = 1;
  o.faults.max_faults = 1;
  o.faults.seed = 1;
  KvSender* sender = Sender(o);
  const std::vector<int32_t> dst = Range(0, 40), src = Range(40, 40);
  receiver_->Expect({11, dst});
  absl::Status s = SendAll(sender, Target(11, dst), src, layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  CompletedTransfer c = completions_.WaitFor(11, 0);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDataLoss) << c.status;
  EXPECT_NE(c.status.message().find("checksum"), std::string::npos) << c.status;
  EXPECT_EQ(receiver_->stats().checksum_failures, 1u);
  EXPECT_EQ(sender->stats().faults_injected, 1u);
  EXPECT_EQ(receiver_->num_in_flight(), 1);  // still reserved for a retry
  ASSERT_TRUE(SendAll(sender, Target(11, dst, 1), src, layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(11, 1).status.ok());
  ExpectCopied(src, dst);
}

TEST_P(TransportTest, DroppedMessageIsDetectedAtFinish) {
  SenderOptions o = SenderOpts();
  o.faults.kv_drop = 1;
  o.faults.max_faults = 1;
  KvSender* sender = Sender(o);
  receiver_->Expect({12, Range(0, 10)});
  absl::Status s = SendAll(sender, Target(12, Range(0, 10)), Range(0, 10), layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("incomplete"), std::string::npos) << s;
  EXPECT_EQ(completions_.WaitFor(12, 0).status.code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(SendAll(sender, Target(12, Range(0, 10), 1), Range(0, 10), layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(12, 1).status.ok());
}

TEST_P(TransportTest, ReceiverGoneMidTransferFailsTheSenderPromptly) {
  KvSender* sender = Sender();
  receiver_->Expect({13, Range(0, 64)});
  auto h = sender->Begin(Target(13, Range(0, 64)), Range(0, 64));
  ASSERT_TRUE(h.ok());
  for (int64_t l = 0; l < 4; ++l) sender->SendLayer(*h, l);
  receiver_.reset();  // the decode worker dies
  const absl::Time start = absl::Now();
  for (int64_t l = 4; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  Done done;
  sender->Finish(*h, "", done.Callback());
  absl::Status s = done.Wait(absl::Seconds(5));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), absl::StatusCode::kUnknown) << s;  // not our wait timing out
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_P(TransportTest, DeadlineExpiresOnBothSides) {
  KvSender* sender = Sender();
  receiver_->Expect({14, Range(0, 8)});
  TransferTarget t = Target(14, Range(0, 8));
  t.deadline = absl::Now() + absl::Milliseconds(150);
  auto h = sender->Begin(t, Range(0, 8));
  ASSERT_TRUE(h.ok());
  sender->SendLayer(*h, 0);  // the prefill stalls after layer 0
  CompletedTransfer c = completions_.WaitFor(14, 0, absl::Seconds(3));
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded) << c.status;
  Done done;
  sender->Finish(*h, "", done.Callback());
  EXPECT_EQ(done.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sender->stats().deadline_expired, 1u);
  receiver_->CancelAndWait(14);
}

TEST_P(TransportTest, SlowTransferPastItsDeadlineFailsWhileFinishing) {
  SenderOptions o = SenderOpts();
  o.faults.kv_delay_ms = 100;
  o.faults.kv_delay = 1;
  KvSender* sender = Sender(o);
  receiver_->Expect({15, Range(0, 8)});
  TransferTarget t = Target(15, Range(0, 8));
  t.deadline = absl::Now() + absl::Milliseconds(250);
  absl::Status s = SendAll(sender, t, Range(0, 8), layout_.num_layers);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_FALSE(completions_.WaitFor(15, 0, absl::Seconds(5)).status.ok());
  receiver_->CancelAndWait(15);
}

TEST_P(TransportTest, AbortTellsTheReceiver) {
  KvSender* sender = Sender();
  receiver_->Expect({16, Range(0, 8)});
  auto h = sender->Begin(Target(16, Range(0, 8)), Range(0, 8));
  ASSERT_TRUE(h.ok());
  sender->SendLayer(*h, 0);
  sender->Abort(*h);
  EXPECT_EQ(sender->num_in_flight(), 0);
  EXPECT_EQ(completions_.WaitFor(16, 0).status.code(), absl::StatusCode::kAborted);
  // Abort after Finish: done runs with ABORTED.
  receiver_->Expect({17, Range(8, 8)});
  auto h2 = sender->Begin(Target(17, Range(8, 8)), Range(0, 8));
  ASSERT_TRUE(h2.ok());
  for (int64_t l = 0; l < 2; ++l) sender->SendLayer(*h2, l);
  Done done;
  sender->Finish(*h2, "", done.Callback());  // fails: layers missing
  sender->Abort(*h2);
  EXPECT_FALSE(done.Wait().ok());
  receiver_->CancelAndWait(16);
  receiver_->CancelAndWait(17);
}

TEST_P(TransportTest, ReceiverCancelStopsTheSender) {
  SenderOptions o = SenderOpts();
  o.faults.kv_delay_ms = 20;  // keep the transfer in flight for a while
  KvSender* sender = Sender(o);
  receiver_->Expect({18, Range(0, 16)});
  auto h = sender->Begin(Target(18, Range(0, 16)), Range(0, 16));
  ASSERT_TRUE(h.ok());
  for (int64_t l = 0; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  Done done;
  sender->Finish(*h, "", done.Callback());
  absl::SleepFor(absl::Milliseconds(30));
  receiver_->CancelAndWait(18);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
  absl::Status s = done.Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), absl::StatusCode::kUnknown) << s;
}

TEST_P(TransportTest, NewerAttemptSupersedesTheOlder) {
  KvSender* sender = Sender();
  receiver_->Expect({19, Range(0, 8)});
  auto old = sender->Begin(Target(19, Range(0, 8), 0), Range(0, 8));
  ASSERT_TRUE(old.ok());
  sender->SendLayer(*old, 0);
  ASSERT_TRUE(SendAll(sender, Target(19, Range(0, 8), 1), Range(8, 8), layout_.num_layers).ok());
  EXPECT_EQ(completions_.WaitFor(19, 0).status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(completions_.WaitFor(19, 1).status.ok());
  ExpectCopied(Range(8, 8), Range(0, 8));
  for (int64_t l = 1; l < layout_.num_layers; ++l) sender->SendLayer(*old, l);
  Done done;
  sender->Finish(*old, "", done.Callback());
  EXPECT_FALSE(done.Wait().ok());
}

TEST_P(TransportTest, ReceiverRestartIsNeverFedAStaleReservation) {
  KvSender* sender = Sender();
  receiver_->Expect({20, Range(0, 4)});
  ASSERT_TRUE(SendAll(sender, Target(20, Range(0, 4)), Range(0, 4), layout_.num_layers).ok());
  const std::string endpoint = receiver_->endpoint();
  const uint64_t old_incarnation = receiver_->incarnation();
  receiver_.reset();
  ReceiverOptions o = ReceiverOpts();
  if (GetParam() == "tcp") {
    o.port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  } else {
    o.name = endpoint;
  }
  StartReceiver(o);  // same endpoint, new life
  ASSERT_EQ(receiver_->endpoint(), endpoint);
  ASSERT_NE(receiver_->incarnation(), old_incarnation);
  receiver_->Expect({21, Range(0, 4)});
  TransferTarget stale = Target(21, Range(0, 4));
  stale.incarnation = old_incarnation;
  EXPECT_EQ(sender->Begin(stale, Range(0, 4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(SendAll(sender, Target(21, Range(0, 4)), Range(4, 4), layout_.num_layers).ok());
  ASSERT_TRUE(completions_.WaitFor(21, 0).status.ok());
  ExpectCopied(Range(4, 4), Range(0, 4));
}

TEST_P(TransportTest, ConcurrentSendersAndTransfers) {
  const int kSenders = 4, kPerSender = 8, kBlocks = 4;
  std::vector<std::unique_ptr<KvSender>> senders;
  for (int i = 0; i < kSenders; ++i) {
    auto s = CreateSender(SenderOpts(), src_.get());
    ASSERT_TRUE(s.ok());
    senders.push_back(std::move(*s));
  }
  for (int i = 0; i < kSenders * kPerSender; ++i) {
    receiver_->Expect({1000u + i, Range(i * kBlocks, kBlocks)});
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSenders; ++i) {
    threads.emplace_back([&, i] {
      std::vector<TransferHandle> handles;
      for (int j = 0; j < kPerSender; ++j) {
        const int n = i * kPerSender + j;
        auto h = senders[i]->Begin(Target(1000 + n, Range(n * kBlocks, kBlocks)),
                                   Range((127 - n) - kBlocks + 1, kBlocks));
        if (!h.ok()) {
          ++failures;
          return;
        }
        handles.push_back(*h);
      }
      for (int64_t l = 0; l < layout_.num_layers; ++l) {
        for (TransferHandle h : handles) senders[i]->SendLayer(h, l);
      }
      std::vector<Done> done(handles.size());
      for (size_t j = 0; j < handles.size(); ++j) {
        senders[i]->Finish(handles[j], "", done[j].Callback());
      }
      for (auto& d : done) {
        if (!d.Wait().ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int n = 0; n < kSenders * kPerSender; ++n) {
    ASSERT_TRUE(completions_.WaitFor(1000 + n, 0).status.ok()) << n;
    ExpectCopied(Range((127 - n) - kBlocks + 1, kBlocks), Range(n * kBlocks, kBlocks));
  }
  for (auto& s : senders) EXPECT_EQ(s->num_in_flight(), 0);
}

TEST_P(TransportTest, SenderShutdownAbortsWhatIsInFlight) {
  SenderOptions o = SenderOpts();
  o.faults.kv_delay_ms = 20;  // keep it in flight
  KvSender* sender = Sender(o);
  receiver_->Expect({22, Range(0, 8)});
  auto h = sender->Begin(Target(22, Range(0, 8)), Range(0, 8));
  ASSERT_TRUE(h.ok());
  for (int64_t l = 0; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  Done done;
  sender->Finish(*h, "", done.Callback());
  sender_.reset();  // the prefill worker shuts down
  EXPECT_EQ(done.Wait(absl::Seconds(1)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(completions_.WaitFor(22, 0).status.code(), absl::StatusCode::kAborted);
  receiver_->CancelAndWait(22);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("tcp", "loopback"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem::kvtransfer
