// The nccl transport run end to end without a GPU: built against the CPU emulator of CUDA and
// NCCL (common/engine/backend/cuda/emulation, whose "device" memory is host memory), with its
// control messages carried by the gRPC control channel the workers use (control_rpc.h). Two
// ranks share the one emulated device; one case puts the receiver in another process. The
// fault-injection cases show the checks here fail when a control message is lost or a transfer
// lands in the wrong block.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/transfer_key.h"
#include "common/cuda/emulation/fake_cuda.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/control_rpc/control_rpc.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/flood_peer.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

extern char** environ;

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::SameRegion;

constexpr int64_t kBlocks = 16;

// Every layer of dst_blocks holds the sender's src_blocks, and no other block was written.
bool LandedExactly(FakePool& src, const std::vector<int32_t>& src_blocks, FakePool& dst,
                   const std::vector<int32_t>& dst_blocks, int64_t layers) {
  for (int64_t l = 0; l < layers; ++l) {
    for (size_t i = 0; i < dst_blocks.size(); ++i) {
      if (!SameRegion(dst, l, dst_blocks[i], src, src_blocks[i])) return false;
    }
    for (int32_t b = 0; b < dst.num_blocks(); ++b) {
      bool target = false;
      for (int32_t d : dst_blocks) target |= d == b;
      if (!target && !dst.IsZero(l, b)) return false;
    }
  }
  return dst.GuardsIntact();
}

// Shifts every block by one: a transport bug that writes the right bytes into the wrong block.
class ShiftedRegions : public KvRegionAccess {
 public:
  explicit ShiftedRegions(FakePool* pool) : pool_(pool) {}
  uint8_t* Region(int64_t layer, int32_t block) override {
    return pool_->Region(layer, (block + 1) % pool_->num_blocks());
  }
  int64_t num_blocks() const override { return pool_->num_blocks(); }

 private:
  FakePool* pool_;
};

// The control server is declared last so it stops first: KvControlServer::SetReceiver's
// receiver must outlive Stop() (a FINISH still in its handler when the test ends).
struct Receiver {
  std::unique_ptr<KvReceiver> receiver;
  std::unique_ptr<KvControlServer> control;
};

Receiver StartReceiver(const KvLayout& layout, KvRegionAccess* pool, Completions* completions,
                       const std::string& secret = "",
                       const KvControlLimits& limits = KvControlLimits()) {
  Receiver r;
  auto control =
      KvControlServer::Start("127.0.0.1", 0, TlsOptions(), secret, absl::Seconds(60), limits);
  EXPECT_TRUE(control.ok()) << control.status();
  r.control = *std::move(control);
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout;
  ro.name = AdvertisedEndpoint("127.0.0.1", "", r.control->port());
  ro.handshake_timeout = absl::Seconds(10);
  auto receiver = CreateReceiver(ro, pool, completions->Callback());
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  r.receiver = *std::move(receiver);
  r.control->SetReceiver(r.receiver.get());
  return r;
}

std::unique_ptr<KvSender> StartSender(const KvLayout& layout, KvRegionAccess* pool,
                                      ControlChannel channel, TransferHooks* hooks = nullptr) {
  SenderOptions so;
  so.hooks = hooks;
  so.transport = "nccl";
  so.layout = layout;
  so.max_communicators = 2;
  so.io_timeout = absl::Seconds(5);
  so.control_channel = std::move(channel);
  auto s = CreateSender(so, pool);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

ControlChannel GrpcChannel(const std::string& secret = "") {
  auto channel = MakeGrpcControlChannel(TlsOptions(), secret, absl::Seconds(10));
  EXPECT_TRUE(channel.ok()) << channel.status();
  return *channel;
}

TransferTarget Target(const KvReceiver& r, uint64_t id, std::vector<int32_t> dst,
                      uint32_t attempt = 0) {
  TransferTarget t{r.endpoint(), r.incarnation(), id, attempt, std::move(dst)};
  t.deadline = absl::Now() + absl::Seconds(20);
  return t;
}

class NcclEmulatedTest : public ::testing::Test {
 protected:
  KvLayout layout_ = testing::SmallLayout();
  FakePool src_{layout_, kBlocks};
  FakePool dst_{layout_, kBlocks};
  Completions completions_;
};

TEST_F(NcclEmulatedTest, TransfersBitExactOverTheGrpcControlChannel) {
  src_.Fill(7);
  Receiver r = StartReceiver(layout_, &dst_, &completions_);
  auto sender = StartSender(layout_, &src_, GrpcChannel());
  r.receiver->Expect({1, {3, 4, 5}});
  ASSERT_TRUE(testing::SendAll(sender.get(), Target(*r.receiver, 1, {3, 4, 5}), {10, 11, 12},
                               layout_.num_layers, "tok")
                  .ok());
  CompletedTransfer c = completions_.WaitFor(1, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "tok");
  EXPECT_TRUE(LandedExactly(src_, {10, 11, 12}, dst_, {3, 4, 5}, layout_.num_layers));
  // The communicator is reused by the next transfer.
  r.receiver->Expect({2, {7}});
  ASSERT_TRUE(
      testing::SendAll(sender.get(), Target(*r.receiver, 2, {7}), {1}, layout_.num_layers, "")
          .ok());
  EXPECT_TRUE(completions_.WaitFor(2, 0).status.ok());
  EXPECT_TRUE(LandedExactly(src_, {10, 11, 12, 1}, dst_, {3, 4, 5, 7}, layout_.num_layers));
  EXPECT_EQ(sender->stats().connects, 1u);
  // Unknown transfers fail at Begin; so does a stale incarnation (a restarted receiver).
  EXPECT_EQ(sender->Begin(Target(*r.receiver, 99, {1}), {1}).status().code(),
            absl::StatusCode::kNotFound);
  TransferTarget stale = Target(*r.receiver, 2, {1});
  stale.incarnation += 1;
  EXPECT_EQ(sender->Begin(stale, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender->num_in_flight(), 0);
  EXPECT_EQ(r.receiver->num_in_flight(), 0);
}

// A transfer costs a constant number of control messages whatever its length (BEGIN and
// FINISH, each answered; the layers go over the communicator), counted by the metric's hook.
TEST_F(NcclEmulatedTest, ATransferCostsAtMostThreeControlMessagesEachWay) {
  for (int64_t layers : {int64_t{2}, int64_t{64}}) {
    SCOPED_TRACE(absl::StrCat(layers, " layers"));
    KvLayout layout = layout_;
    layout.num_layers = layers;
    FakePool src(layout, kBlocks), dst(layout, kBlocks);
    src.Fill(7);
    Completions completions;
    Receiver r = StartReceiver(layout, &dst, &completions);
    testing::ControlCounts hooks;
    auto sender = StartSender(layout, &src, GrpcChannel(), &hooks);
    const TransportStats before = r.receiver->stats();
    for (uint64_t id : {1, 2}) {
      r.receiver->Expect({id, {static_cast<int32_t>(id), 5}});
      ASSERT_TRUE(testing::SendAll(sender.get(),
                                   Target(*r.receiver, id, {static_cast<int32_t>(id), 5}), {10, 11},
                                   layers, "")
                      .ok());
      ASSERT_TRUE(completions.WaitFor(id, 0).status.ok());
    }
    const auto counts = hooks.WaitForCounts(2);
    ASSERT_EQ(counts.size(), 2u);
    for (const auto& [to_receiver, to_sender] : counts) {
      EXPECT_LE(to_receiver, 3);
      EXPECT_LE(to_sender, 3);
    }
    // The receiver's count: CONNECT, then the transfers'.
    const TransportStats after = r.receiver->stats();
    EXPECT_LE(after.control_received - before.control_received - 1, 2u * 3);
    EXPECT_LE(after.control_sent - before.control_sent - 1, 2u * 3);
  }
}

// Windowed layers (a window-layout pool's local layers) move only the window's blocks: the
// others stay untouched, and a sender that sends a windowed layer's earlier block is refused.
TEST_F(NcclEmulatedTest, WindowedLayersMoveOnlyTheWindowsBlocks) {
  src_.Fill(5);
  Receiver r = StartReceiver(layout_, &dst_, &completions_);
  auto sender = StartSender(layout_, &src_, GrpcChannel());
  Expectation e{1, {3, 4, 5, 6}};
  e.window_layers = {1, 3};
  e.window_first = 2;
  r.receiver->Expect(e);
  TransferTarget t = Target(*r.receiver, 1, e.dst_blocks);
  t.window_layers = e.window_layers;
  t.window_first = e.window_first;
  const std::vector<int32_t> src = {10, 11, 12, 13};
  ASSERT_TRUE(testing::SendAll(sender.get(), t, src, layout_.num_layers, "w").ok());
  ASSERT_TRUE(completions_.WaitFor(1, 0).status.ok());
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    const size_t from = l % 2 == 1 ? 2 : 0;
    for (size_t i = 0; i < e.dst_blocks.size(); ++i) {
      if (i >= from) {
        EXPECT_TRUE(SameRegion(dst_, l, e.dst_blocks[i], src_, src[i])) << l << " " << i;
      } else {
        EXPECT_TRUE(dst_.IsZero(l, e.dst_blocks[i])) << l << " " << i;
      }
    }
  }
  EXPECT_EQ(sender->stats().bytes, (4u * 4 - 2 * 2) * layout_.region_bytes());
  // A sender ignoring the window: its first windowed-layer message is refused, nothing written.
  Expectation again{2, {7, 8}};
  again.window_layers = {1, 3};
  again.window_first = 1;
  r.receiver->Expect(again);
  absl::Status s = testing::SendAll(sender.get(), Target(*r.receiver, 2, {7, 8}), {1, 2},
                                    layout_.num_layers, "");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(dst_.IsZero(1, 7));
  EXPECT_TRUE(dst_.IsZero(3, 7));
  r.receiver->CancelAndWait(2);
  EXPECT_TRUE(dst_.GuardsIntact());
  EXPECT_EQ(sender->num_in_flight(), 0);
}

// The same traffic with the control messages handed straight to the receiver (no gRPC in the
// process's threads): the case scripts/sanitize.sh runs under TSan, whose reports inside the
// uninstrumented system gRPC would hide the sender's and receiver's own threads.
TEST_F(NcclEmulatedTest, ConcurrentTransfersOverADirectControlChannel) {
  src_.Fill(3);
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout_;
  ro.name = "direct";
  ro.handshake_timeout = absl::Seconds(10);
  auto receiver = CreateReceiver(ro, &dst_, completions_.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  KvReceiver* rp = receiver->get();
  auto sender = StartSender(layout_, &src_, [rp](const std::string&, const std::string& bytes) {
    return rp->HandleControl(bytes);
  });
  constexpr int kTransfers = 4;
  for (int i = 0; i < kTransfers; ++i) {
    rp->Expect({static_cast<uint64_t>(i + 1), {2 * i, 2 * i + 1}});
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kTransfers; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(testing::SendAll(sender.get(), Target(*rp, i + 1, {2 * i, 2 * i + 1}), {i, i + 8},
                                   layout_.num_layers, "")
                      .ok());
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<int32_t> from, to;
  for (int i = 0; i < kTransfers; ++i) {
    EXPECT_TRUE(completions_.WaitFor(i + 1, 0).status.ok());
    from.insert(from.end(), {i, i + 8});
    to.insert(to.end(), {2 * i, 2 * i + 1});
  }
  EXPECT_TRUE(LandedExactly(src_, from, dst_, to, layout_.num_layers));
  EXPECT_EQ(sender->stats().connects, 1u);  // the racing Begins shared one communicator
  sender.reset();                           // DISCONNECT while the receiver is up
  EXPECT_EQ(rp->num_in_flight(), 0);
}

// Several transfers to one receiver are in flight at once: the sender's thread that enqueues
// their messages never waits for a transfer to complete, and a transfer's FINISH (waiting for
// its messages, then the control round trip) does not hold up the next transfer's messages.
// Here the first transfer's FINISH is held in the control channel; the second transfer's
// messages must reach the receiver meanwhile, and both then complete bit-exact.
TEST_F(NcclEmulatedTest, TwoTransfersToOneReceiverOverlapOverADirectControlChannel) {
  src_.Fill(9);
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout_;
  ro.name = "direct";
  ro.handshake_timeout = absl::Seconds(10);
  auto receiver = CreateReceiver(ro, &dst_, completions_.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  KvReceiver* rp = receiver->get();
  std::mutex mu;
  std::condition_variable cv;
  bool first_finish_held = false, release = false;
  auto sender = StartSender(layout_, &src_, [&](const std::string&, const std::string& bytes) {
    ControlRequest req;
    wire::Finish f;
    if (DecodeRequest(bytes, nccl::kConnect, nccl::kDisconnect, "kv", &req).ok() &&
        req.kind == nccl::kFinish && wire::DecodeFinish(req.body, &f).ok() && f.transfer_id == 1) {
      std::unique_lock<std::mutex> lock(mu);
      first_finish_held = true;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
    }
    return rp->HandleControl(bytes);
  });
  rp->Expect({1, {0, 1, 2}});
  rp->Expect({2, {3, 4}});
  const int64_t layers = layout_.num_layers;
  absl::StatusOr<TransferHandle> h1 = sender->Begin(Target(*rp, 1, {0, 1, 2}), {8, 9, 10});
  ASSERT_TRUE(h1.ok()) << h1.status();
  for (int64_t l = 0; l < layers; ++l) sender->SendLayer(*h1, l);
  testing::Done done1;
  sender->Finish(*h1, "one", done1.Callback());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return first_finish_held; }));
  }
  // The first transfer's FINISH is in flight (held): the second begins and sends its layers.
  absl::StatusOr<TransferHandle> h2 = sender->Begin(Target(*rp, 2, {3, 4}), {11, 12});
  ASSERT_TRUE(h2.ok()) << h2.status();
  for (int64_t l = 0; l < layers; ++l) sender->SendLayer(*h2, l);
  testing::Done done2;
  sender->Finish(*h2, "two", done2.Callback());
  // Every DATA message of both transfers lands while the first's FINISH is still held.
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (rp->stats().frames < static_cast<uint64_t>(2 * layers) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const uint64_t landed_while_held = rp->stats().frames;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  EXPECT_EQ(landed_while_held, static_cast<uint64_t>(2 * layers))
      << "the second transfer's messages waited for the first transfer's FINISH";
  EXPECT_TRUE(done1.Wait().ok());
  EXPECT_TRUE(done2.Wait().ok());
  EXPECT_EQ(completions_.WaitFor(1, 0).trailer, "one");
  EXPECT_EQ(completions_.WaitFor(2, 0).trailer, "two");
  EXPECT_TRUE(LandedExactly(src_, {8, 9, 10, 11, 12}, dst_, {0, 1, 2, 3, 4}, layers));
  EXPECT_EQ(sender->stats().connects, 1u);
  sender.reset();
  EXPECT_EQ(rp->num_in_flight(), 0);
}

// The sender's pool whose layer 0 is written on an engine stream held back by a gate; the
// layer's event is recorded behind the write (what the engine does per layer).
class GatedPool : public FakePool {
 public:
  GatedPool(const KvLayout& layout, int64_t blocks) : FakePool(layout, blocks) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
  }
  ~GatedPool() override {
    Open();
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(event_);
    cudaStreamDestroy(stream_);
  }
  // Layer 0's regions read zero until the gate opens; then the stream writes back what they held.
  void WriteLayer0Behind(size_t region_bytes) {
    saved_.clear();
    for (int32_t b = 0; b < num_blocks(); ++b) {
      saved_.emplace_back(Region(0, b), Region(0, b) + region_bytes);
      std::memset(Region(0, b), 0, region_bytes);
    }
    cuda_emu::StreamEnqueueAsync(stream_, [this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
      for (int32_t b = 0; b < num_blocks(); ++b) {
        std::memcpy(Region(0, b), saved_[b].data(), saved_[b].size());
      }
    });
    EXPECT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void* LayerReadyEvent(int64_t layer) override { return layer == 0 ? event_ : nullptr; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::vector<std::vector<uint8_t>> saved_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// No host synchronization per layer: a DATA message waits on the device (the communicator's
// stream) for the engine's event of its layer, and the sender's thread never waits for a
// message. Layer 0 is still being written when the sender is asked to send it: every layer's
// message is enqueued at once, none lands before the event, and what lands is the written KV,
// not the zeros before it.
TEST_F(NcclEmulatedTest, MessagesWaitForTheLayersEventOnTheDeviceOverADirectControlChannel) {
  GatedPool src(layout_, kBlocks);
  src.Fill(7);
  src.WriteLayer0Behind(layout_.region_bytes());
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout_;
  ro.name = "direct";
  ro.handshake_timeout = absl::Seconds(10);
  auto receiver = CreateReceiver(ro, &dst_, completions_.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  KvReceiver* rp = receiver->get();
  auto sender = StartSender(layout_, &src, [rp](const std::string&, const std::string& bytes) {
    return rp->HandleControl(bytes);
  });
  rp->Expect({1, {3, 4, 5}});
  absl::StatusOr<TransferHandle> h = sender->Begin(Target(*rp, 1, {3, 4, 5}), {10, 11, 12});
  ASSERT_TRUE(h.ok()) << h.status();
  for (int64_t l = 0; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  testing::Done done;
  sender->Finish(*h, "tok", done.Callback());
  EXPECT_TRUE(testing::Eventually(
      [&] { return sender->stats().frames >= static_cast<uint64_t>(layout_.num_layers); },
      absl::Seconds(3)))
      << "the sender's thread waited for a message";
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(rp->stats().frames, 0u) << "a message went before its layer's event";
  EXPECT_EQ(sender->num_in_flight(), 1);
  src.Open();
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_TRUE(completions_.WaitFor(1, 0).status.ok());
  EXPECT_TRUE(LandedExactly(src, {10, 11, 12}, dst_, {3, 4, 5}, layout_.num_layers));
  EXPECT_FALSE(dst_.IsZero(0, 3));
}

// CONNECTs of one sender that race (a client retrying, or a hostile one) leave the receiver one
// communicator for it; the ones replaced are stopped, never dropped while their thread runs.
TEST_F(NcclEmulatedTest, RacingConnectsOfOneSenderKeepOneCommunicator) {
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout_;
  ro.name = "direct";
  ro.handshake_timeout = absl::Milliseconds(300);
  ro.max_communicators = 8;
  auto receiver = CreateReceiver(ro, &dst_, completions_.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  wire::Hello hello;
  hello.layout = layout_;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<std::string> id = nccl::NewUniqueId();
      ASSERT_TRUE(id.ok()) << id.status();
      const std::string request = EncodeRequest(
          {nccl::kConnect, /*sender_id=*/42, nccl::EncodeConnect(*id, wire::EncodeHello(hello))});
      EXPECT_TRUE((*receiver)->HandleControl(request).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  receiver->reset();  // stops the one left (its rank 0 never came)
}

TEST_F(NcclEmulatedTest, LayoutMismatchIsRefusedNamingTheField) {
  Receiver r = StartReceiver(layout_, &dst_, &completions_);
  KvLayout other = layout_;
  other.num_kv_heads += 1;
  FakePool other_src(other, kBlocks);
  auto sender = StartSender(other, &other_src, GrpcChannel());
  r.receiver->Expect({1, {0}});
  auto h = sender->Begin(Target(*r.receiver, 1, {0}), {0});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("num_kv_heads"), std::string::npos) << h.status();
  r.receiver->CancelAndWait(1);
}

TEST_F(NcclEmulatedTest, TheSharedSecretGuardsEveryControlMessage) {
  const std::string secret = "0123456789abcdef-secret";
  Receiver r = StartReceiver(layout_, &dst_, &completions_, secret);
  r.receiver->Expect({1, {2}});
  for (const std::string& theirs : {std::string(), std::string("another-secret-0123456")}) {
    auto sender = StartSender(layout_, &src_, GrpcChannel(theirs));
    auto h = sender->Begin(Target(*r.receiver, 1, {2}), {2});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kUnauthenticated) << h.status();
  }
  src_.Fill(3);
  auto sender = StartSender(layout_, &src_, GrpcChannel(secret));
  ASSERT_TRUE(
      testing::SendAll(sender.get(), Target(*r.receiver, 1, {2}), {9}, layout_.num_layers, "")
          .ok());
  EXPECT_TRUE(LandedExactly(src_, {9}, dst_, {2}, layout_.num_layers));
}

// The transfer's key over the gRPC control channel: another sender holding the shared secret
// but not the key (with the transfer's id, blocks and a higher attempt) is refused at Begin,
// telling nothing, and lands nothing; the named sender's transfer then completes bit-exact.
TEST_F(NcclEmulatedTest, OnlyTheSenderProvingTheKeyLands) {
  const std::string secret = "0123456789abcdef-secret";
  const std::string key(kTransferKeyBytes, 'k');
  Receiver r = StartReceiver(layout_, &dst_, &completions_, secret);
  r.receiver->Expect({3, {4, 5}, {}, 0, key});
  FakePool other{layout_, kBlocks};
  other.Fill(99);
  auto intruder = StartSender(layout_, &other, GrpcChannel(secret));
  for (const std::string& theirs : {std::string(), std::string(kTransferKeyBytes, 'x')}) {
    TransferTarget t = Target(*r.receiver, 3, {4, 5}, /*attempt=*/9);
    t.transfer_key = theirs;
    absl::Status s = testing::SendAll(intruder.get(), t, {1, 2}, layout_.num_layers, "x");
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_EQ(s.message().find("expects"), std::string::npos) << s;
  }
  EXPECT_TRUE(dst_.IsZero(0, 4) && dst_.IsZero(0, 5));
  src_.Fill(3);
  auto named = StartSender(layout_, &src_, GrpcChannel(secret));
  TransferTarget t = Target(*r.receiver, 3, {4, 5});
  t.transfer_key = TransferAttemptKey(key, t.attempt);
  ASSERT_TRUE(testing::SendAll(named.get(), t, {6, 7}, layout_.num_layers, "named").ok());
  CompletedTransfer c = completions_.WaitFor(3, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "named");
  EXPECT_TRUE(LandedExactly(src_, {6, 7}, dst_, {4, 5}, layout_.num_layers));
  EXPECT_GE(r.receiver->stats().messages_refused, 2u);
}

// Floods of the control port (from one address, then from many) while honest transfers run:
// the flood is cut at the caps (front_door.h) and both transfers land bit-exact.
TEST_F(NcclEmulatedTest, TransfersLandWhileTheControlPortIsFlooded) {
  const std::string secret = "0123456789abcdef-secret";
  KvControlLimits limits;
  limits.max_connections = 8;
  limits.max_connections_per_peer = 3;
  Receiver r = StartReceiver(layout_, &dst_, &completions_, secret, limits);
  std::vector<int> flood;
  for (int i = 0; i < 20; ++i) {
    const int fd = testing::ConnectFrom("127.0.0.2", r.control->port());
    ASSERT_GE(fd, 0);
    flood.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(testing::CountOpen(flood), 3);
  src_.Fill(5);
  auto sender = StartSender(layout_, &src_, GrpcChannel(secret));
  r.receiver->Expect({1, {2, 3}});
  ASSERT_TRUE(testing::SendAll(sender.get(), Target(*r.receiver, 1, {2, 3}), {7, 8},
                               layout_.num_layers, "one")
                  .ok());
  ASSERT_TRUE(completions_.WaitFor(1, 0).status.ok());
  // Every other slot taken from other addresses: the honest connection keeps its own.
  for (int a = 3; a <= 6; ++a) {
    for (int i = 0; i < 3; ++i) {
      const int fd = testing::ConnectFrom(absl::StrCat("127.0.0.", a), r.control->port());
      ASSERT_GE(fd, 0);
      flood.push_back(fd);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(r.control->open_connections(), limits.max_connections);
  EXPECT_EQ(testing::CountOpen(flood), limits.max_connections - 1);
  r.receiver->Expect({2, {9, 10}});
  ASSERT_TRUE(testing::SendAll(sender.get(), Target(*r.receiver, 2, {9, 10}), {11, 12},
                               layout_.num_layers, "two")
                  .ok());
  ASSERT_TRUE(completions_.WaitFor(2, 0).status.ok());
  EXPECT_TRUE(LandedExactly(src_, {7, 8, 11, 12}, dst_, {2, 3, 9, 10}, layout_.num_layers));
  testing::CloseAll(&flood);
}

// Fault injection: a control message that never arrives. The FINISH is lost: the sender must not
// report success, the receiver must not complete the transfer OK, and nothing stays in flight.
TEST_F(NcclEmulatedTest, ADroppedControlMessageFailsTheTransfer) {
  src_.Fill(5);
  Receiver r = StartReceiver(layout_, &dst_, &completions_);
  ControlChannel grpc = GrpcChannel();
  const char kFinish = 3;  // nccl::ControlKind::kFinish
  auto sender = StartSender(layout_, &src_, [&](const std::string& ep, const std::string& req) {
    if (!req.empty() && req[0] == kFinish) {
      return absl::StatusOr<std::string>(absl::UnavailableError("control message dropped"));
    }
    return grpc(ep, req);
  });
  r.receiver->Expect({4, {1, 2}});
  TransferTarget t = Target(*r.receiver, 4, {1, 2});
  t.deadline = absl::Now() + absl::Seconds(3);
  absl::Status sent = testing::SendAll(sender.get(), t, {5, 6}, layout_.num_layers, "x");
  EXPECT_FALSE(sent.ok());
  CompletedTransfer c = completions_.WaitFor(4, 0, absl::Seconds(10));
  EXPECT_FALSE(c.status.ok()) << "a transfer whose FINISH was lost completed OK";
  r.receiver->CancelAndWait(4);
  EXPECT_TRUE(testing::Eventually([&] { return sender->num_in_flight() == 0; }));
  EXPECT_EQ(r.receiver->num_in_flight(), 0);
}

// Fault injection: the receiver's regions are off by one block. The transport cannot see it;
// the bit-exact check the other cases use must (it fails here, as it would on such a bug).
TEST_F(NcclEmulatedTest, ATransferLandingInTheWrongBlockFailsTheCheck) {
  src_.Fill(11);
  ShiftedRegions shifted(&dst_);
  Receiver r = StartReceiver(layout_, &shifted, &completions_);
  auto sender = StartSender(layout_, &src_, GrpcChannel());
  r.receiver->Expect({5, {3}});
  ASSERT_TRUE(
      testing::SendAll(sender.get(), Target(*r.receiver, 5, {3}), {8}, layout_.num_layers, "")
          .ok());
  EXPECT_FALSE(LandedExactly(src_, {8}, dst_, {3}, layout_.num_layers));
  EXPECT_TRUE(LandedExactly(src_, {8}, dst_, {4}, layout_.num_layers));  // where it went
}

// The receiver goes away mid-transfer: the sender's transfer fails (no hang), nothing stays in
// flight, and a new receiver (new incarnation) on the same pool takes transfers again.
TEST_F(NcclEmulatedTest, AReceiverThatGoesAwayFailsItsTransfers) {
  Receiver r = StartReceiver(layout_, &dst_, &completions_);
  auto sender = StartSender(layout_, &src_, GrpcChannel());
  r.receiver->Expect({6, {1, 2}});
  auto h = sender->Begin(Target(*r.receiver, 6, {1, 2}), {1, 2});
  ASSERT_TRUE(h.ok()) << h.status();
  sender->SendLayer(*h, 0);
  const uint64_t old_incarnation = r.receiver->incarnation();
  r.control->Stop();
  r.receiver.reset();
  testing::Done done;
  for (int64_t l = 1; l < layout_.num_layers; ++l) sender->SendLayer(*h, l);
  sender->Finish(*h, "", done.Callback());
  EXPECT_FALSE(done.Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(sender->num_in_flight(), 0);

  Completions again;
  dst_.Zero();
  Receiver r2 = StartReceiver(layout_, &dst_, &again);
  EXPECT_NE(r2.receiver->incarnation(), old_incarnation);
  src_.Fill(2);
  r2.receiver->Expect({7, {0}});
  ASSERT_TRUE(
      testing::SendAll(sender.get(), Target(*r2.receiver, 7, {0}), {3}, layout_.num_layers, "")
          .ok());
  EXPECT_TRUE(LandedExactly(src_, {3}, dst_, {0}, layout_.num_layers));
}

// The receiver in another process (this binary, re-run with TANDEM_NCCL_EMU_CHILD): the
// emulated communicator crosses processes over loopback, as NCCL crosses GPUs.
TEST(NcclEmulatedChild, Receiver) {
  const char* port_file = std::getenv("TANDEM_NCCL_EMU_CHILD");
  if (port_file == nullptr) GTEST_SKIP() << "runs as the child of CrossesProcesses";
  KvLayout layout = testing::SmallLayout();
  FakePool dst(layout, kBlocks);
  Completions completions;
  Receiver r = StartReceiver(layout, &dst, &completions);
  r.receiver->Expect({42, {1, 6}});
  {
    std::ofstream(std::string(port_file) + ".tmp")
        << r.receiver->endpoint() << " " << r.receiver->incarnation() << "\n";
    std::rename((std::string(port_file) + ".tmp").c_str(), port_file);
  }
  CompletedTransfer c = completions.WaitFor(42, 0, absl::Seconds(60));
  ASSERT_TRUE(c.status.ok()) << c.status;
  FakePool expected(layout, kBlocks);
  expected.Fill(99);
  EXPECT_TRUE(LandedExactly(expected, {12, 13}, dst, {1, 6}, layout.num_layers));
}

TEST_F(NcclEmulatedTest, CrossesProcesses) {
  const std::string port_file =
      absl::StrCat(::testing::TempDir(), "/nccl_emu_child_", getpid(), ".port");
  std::remove(port_file.c_str());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  env_strings.push_back("TANDEM_NCCL_EMU_CHILD=" + port_file);
  std::vector<char*> env;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=NcclEmulatedChild.Receiver";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
  std::string endpoint;
  uint64_t incarnation = 0;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        std::ifstream in(port_file);
        return static_cast<bool>(in >> endpoint >> incarnation);
      },
      absl::Seconds(30)));
  src_.Fill(99);
  auto sender = StartSender(layout_, &src_, GrpcChannel());
  TransferTarget t{endpoint, incarnation, 42, 0, {1, 6}};
  t.deadline = absl::Now() + absl::Seconds(30);
  EXPECT_TRUE(testing::SendAll(sender.get(), t, {12, 13}, layout_.num_layers, "").ok());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child receiver failed";
  std::remove(port_file.c_str());
}

}  // namespace
}  // namespace tandem::kvtransfer
