// The nccl transport's coalescing (protocol 2) against the CPU emulator of CUDA and NCCL, over a
// direct control channel (so TSan runs it): regions adjacent in both pools travel as one
// ncclSend / ncclRecv per run, counted by the transport (device_copies) and by the emulator,
// whose receives fail when their size differs from their send's; the receiver's WELCOME says
// whether its blocks are adjacent, a hand-written sender that merges blocks the receiver did not
// say were adjacent lands nothing, the kv_misplace fault still lands runs in the wrong blocks,
// and a protocol-1 peer is refused naming the protocol.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/crc32c.h"
// Also the emulator's NCCL (FakeNcclSendCalls), through the transport's CUDA/NCCL header.
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::FakePool;
using testing::SameRegion;

constexpr int64_t kBlocks = 16;

// Every layer of dst_blocks holds the sender's src_blocks, and every other block is zero.
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

// A receiver answering control messages in-process, and a sender talking to it directly.
struct Pair {
  std::unique_ptr<KvReceiver> receiver;
  std::unique_ptr<KvSender> sender;
};

std::unique_ptr<KvReceiver> StartReceiver(const KvLayout& layout, KvRegionAccess* pool,
                                          Completions* completions,
                                          const FaultOptions& faults = FaultOptions()) {
  ReceiverOptions ro;
  ro.transport = "nccl";
  ro.layout = layout;
  ro.name = "direct";
  ro.handshake_timeout = absl::Seconds(2);
  ro.faults = faults;
  ro.faults_from_env = false;
  auto receiver = CreateReceiver(ro, pool, completions->Callback());
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  return receiver.ok() ? *std::move(receiver) : nullptr;
}

std::unique_ptr<KvSender> StartSender(const KvLayout& layout, KvRegionAccess* pool,
                                      ControlChannel channel) {
  SenderOptions so;
  so.transport = "nccl";
  so.layout = layout;
  so.max_communicators = 2;
  so.io_timeout = absl::Seconds(5);
  so.control_channel = std::move(channel);
  so.faults_from_env = false;
  auto s = CreateSender(so, pool);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

Pair Start(const KvLayout& layout, KvRegionAccess* src, KvRegionAccess* dst,
           Completions* completions, const FaultOptions& faults = FaultOptions()) {
  Pair p;
  p.receiver = StartReceiver(layout, dst, completions, faults);
  KvReceiver* rp = p.receiver.get();
  p.sender = StartSender(layout, src, [rp](const std::string&, const std::string& bytes) {
    return rp->HandleControl(bytes);
  });
  return p;
}

TransferTarget Target(const KvReceiver& r, uint64_t id, std::vector<int32_t> dst) {
  TransferTarget t{r.endpoint(), r.incarnation(), id, 0, std::move(dst)};
  t.deadline = absl::Now() + absl::Seconds(20);
  return t;
}

// Device calls one transfer cost: the transport's counts on both sides and the emulator's.
struct Calls {
  uint64_t sender = 0, receiver = 0, nccl_sends = 0, nccl_recvs = 0;
};

Calls Transfer(Pair& p, Completions& completions, uint64_t id, const std::vector<int32_t>& src,
               const std::vector<int32_t>& dst, int64_t layers) {
  const TransportStats s0 = p.sender->stats(), r0 = p.receiver->stats();
  const uint64_t sends = FakeNcclSendCalls(), recvs = FakeNcclRecvCalls();
  p.receiver->Expect({id, dst});
  EXPECT_TRUE(testing::SendAll(p.sender.get(), Target(*p.receiver, id, dst), src, layers).ok());
  EXPECT_TRUE(completions.WaitFor(id, 0).status.ok());
  return {p.sender->stats().device_copies - s0.device_copies,
          p.receiver->stats().device_copies - r0.device_copies, FakeNcclSendCalls() - sends,
          FakeNcclRecvCalls() - recvs};
}

class NcclCoalesceTest : public ::testing::Test {
 protected:
  KvLayout layout_ = testing::SmallLayout();
  // No guard bytes: the regions of a layer are adjacent, as in the engines' pools.
  FakePool src_{layout_, kBlocks, /*guard=*/0};
  FakePool dst_{layout_, kBlocks, /*guard=*/0};
  Completions completions_;
};

// A transfer of contiguous blocks into contiguous blocks: one send and one receive per layer
// (plus the message's header), however many blocks. Protocol 1 sent each region on its own.
TEST_F(NcclCoalesceTest, ContiguousBlocksGoAsOneSendPerLayer) {
  src_.Fill(3);
  Pair p = Start(layout_, &src_, &dst_, &completions_);
  const std::vector<int32_t> from = testing::Range(2, 8), to = testing::Range(6, 8);
  const int64_t layers = layout_.num_layers;
  const Calls c = Transfer(p, completions_, 1, from, to, layers);
  EXPECT_TRUE(LandedExactly(src_, from, dst_, to, layers));
  EXPECT_EQ(c.sender, static_cast<uint64_t>(layers));
  EXPECT_EQ(c.receiver, static_cast<uint64_t>(layers));
  EXPECT_EQ(c.nccl_sends, static_cast<uint64_t>(2 * layers));  // a header and one run each
  // The receiver's thread may already wait for the next message's header.
  EXPECT_GE(c.nccl_recvs, static_cast<uint64_t>(2 * layers));
  EXPECT_LE(c.nccl_recvs, static_cast<uint64_t>(2 * layers + 1));
}

// Runs break wherever either side's blocks do: [0,1,2]->[3,4,5] and [5,6]->[9,10] are runs,
// 8->1 and 9->12 (adjacent on the sender only) are not.
TEST_F(NcclCoalesceTest, RunsBreakWhereEitherSidesBlocksDo) {
  src_.Fill(5);
  Pair p = Start(layout_, &src_, &dst_, &completions_);
  const std::vector<int32_t> from = {0, 1, 2, 5, 6, 8, 9}, to = {3, 4, 5, 9, 10, 1, 12};
  const int64_t layers = layout_.num_layers;
  const Calls c = Transfer(p, completions_, 2, from, to, layers);
  EXPECT_TRUE(LandedExactly(src_, from, dst_, to, layers));
  EXPECT_EQ(c.sender, static_cast<uint64_t>(4 * layers));
  EXPECT_EQ(c.receiver, static_cast<uint64_t>(4 * layers));
  EXPECT_EQ(c.nccl_sends, static_cast<uint64_t>(5 * layers));
}

// A receiver whose consecutive blocks are not adjacent (guard bytes between them) says so in its
// WELCOME: the sender merges nothing, every guard byte stays.
TEST_F(NcclCoalesceTest, AReceiverWithScatteredBlocksGetsOneSendPerRegion) {
  FakePool guarded(layout_, kBlocks);
  src_.Fill(7);
  Pair p = Start(layout_, &src_, &guarded, &completions_);
  const std::vector<int32_t> from = testing::Range(0, 5), to = testing::Range(4, 5);
  const Calls c = Transfer(p, completions_, 3, from, to, layout_.num_layers);
  EXPECT_TRUE(LandedExactly(src_, from, guarded, to, layout_.num_layers));
  EXPECT_EQ(c.sender, static_cast<uint64_t>(5 * layout_.num_layers));
  EXPECT_EQ(c.receiver, static_cast<uint64_t>(5 * layout_.num_layers));
}

// A run carries at most kMaxRunBytes (the receiver's scratch for a refused run): with 1 MiB
// regions, 6 contiguous blocks go as runs of 4 and 2.
TEST_F(NcclCoalesceTest, RunsAreCappedAtTheReceiversMaximum) {
  KvLayout big = layout_;
  big.num_layers = 2;
  big.num_kv_heads = 8;
  big.block_size = 64;
  big.head_dim = 256;
  big.kv_dtype = DType::kF32;
  ASSERT_EQ(big.region_bytes(), size_t{1} << 20);
  FakePool src(big, 8, 0), dst(big, 8, 0);
  src.Fill(9);
  Completions completions;
  Pair p = Start(big, &src, &dst, &completions);
  const std::vector<int32_t> blocks = testing::Range(1, 6);
  const Calls c = Transfer(p, completions, 4, blocks, blocks, big.num_layers);
  EXPECT_TRUE(LandedExactly(src, blocks, dst, blocks, big.num_layers));
  EXPECT_EQ(c.sender, 2u * 2);
  EXPECT_EQ(c.receiver, 2u * 2);
}

// Fault injection on the coalesced path: the receiver lands each run one block off (one back
// for a run that ends the pool). The transfer "succeeds"; the bit-exact check must fail.
TEST_F(NcclCoalesceTest, AMisplacedRunFailsTheBitExactCheck) {
  src_.Fill(11);
  FaultOptions faults;
  faults.kv_misplace = 1;
  Pair p = Start(layout_, &src_, &dst_, &completions_, faults);
  const std::vector<int32_t> from = testing::Range(0, 4), to = testing::Range(12, 4);
  const Calls c = Transfer(p, completions_, 5, from, to, layout_.num_layers);
  EXPECT_EQ(c.receiver, static_cast<uint64_t>(layout_.num_layers));
  EXPECT_FALSE(LandedExactly(src_, from, dst_, to, layout_.num_layers));
  EXPECT_TRUE(LandedExactly(src_, from, dst_, testing::Range(11, 4), layout_.num_layers));
}

// What a protocol-1 peer sees: a CONNECT without the protocol field is refused naming it, and a
// sender refuses a WELCOME without it.
TEST_F(NcclCoalesceTest, AProtocolOnePeerIsRefusedNamingTheProtocol) {
  std::unique_ptr<KvReceiver> receiver = StartReceiver(layout_, &dst_, &completions_);
  absl::StatusOr<std::string> id = nccl::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  wire::Hello hello;
  hello.layout = layout_;
  std::string old_connect = *id;
  old_connect.resize(nccl::kUniqueIdBytes, '\0');
  old_connect += wire::EncodeHello(hello);
  absl::StatusOr<std::string> reply =
      receiver->HandleControl(EncodeRequest({nccl::kConnect, 41, old_connect}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ControlReply decoded;
  ASSERT_TRUE(DecodeReply(*reply, &decoded).ok());
  EXPECT_EQ(decoded.type, wire::FrameType::kRefuse);
  EXPECT_NE(decoded.body.find("nccl protocol 1"), std::string::npos) << decoded.body;

  // The receiver answers as protocol 1 did: the bare WELCOME metadata.
  KvReceiver* rp = receiver.get();
  auto sender = StartSender(layout_, &src_, [rp](const std::string&, const std::string& bytes) {
    absl::StatusOr<std::string> r = rp->HandleControl(bytes);
    ControlReply c;
    absl::string_view welcome;
    uint32_t max_run = 0;
    if (r.ok() && DecodeReply(*r, &c).ok() && c.type == wire::FrameType::kWelcome &&
        nccl::DecodeWelcomeBody(c.body, &welcome, &max_run).ok()) {
      return absl::StatusOr<std::string>(
          EncodeReply({wire::FrameType::kWelcome, std::string(welcome)}));
    }
    return r;
  });
  receiver->Expect({6, {1}});
  absl::StatusOr<TransferHandle> h = sender->Begin(Target(*receiver, 6, {1}), {1});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("nccl protocol 1"), std::string::npos) << h.status();
  receiver->CancelAndWait(6);
}

// A sender that merges blocks the receiver's pool does not hold adjacently (here 3 and 7, as
// one 2-region run) lands nothing: the message goes to scratch and the attempt fails
// INVALID_ARGUMENT; the link stays framed, so the next attempt's honest messages land.
TEST_F(NcclCoalesceTest, ARunOverBlocksNotAdjacentOnTheReceiverLandsNothing) {
  std::unique_ptr<KvReceiver> receiver = StartReceiver(layout_, &dst_, &completions_);
  absl::StatusOr<std::string> id = nccl::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  wire::Hello hello;
  hello.layout = layout_;
  constexpr uint64_t kSender = 43;
  ControlReply reply;
  auto exchange = [&](uint8_t kind, const std::string& body) {
    absl::StatusOr<std::string> r = receiver->HandleControl(EncodeRequest({kind, kSender, body}));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r.ok() && DecodeReply(*r, &reply).ok());
  };
  exchange(nccl::kConnect, nccl::EncodeConnect(*id, wire::EncodeHello(hello)));
  ASSERT_EQ(reply.type, wire::FrameType::kWelcome);
  absl::string_view welcome;
  uint32_t max_run = 0;
  ASSERT_TRUE(nccl::DecodeWelcomeBody(reply.body, &welcome, &max_run).ok());
  EXPECT_GT(max_run, 1u);  // its blocks are adjacent: consecutive ids may merge
  auto comm = nccl::Communicator::Start(*id, /*rank=*/0, /*device=*/0, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->WaitReady(absl::Now() + absl::Seconds(5), nullptr).ok());

  const std::vector<int32_t> dst = {3, 7};
  receiver->Expect({8, dst});
  wire::Begin begin;
  begin.transfer_id = 8;
  begin.incarnation = receiver->incarnation();
  begin.deadline_ms = 10000;
  begin.dst_blocks = dst;
  exchange(nccl::kBegin, wire::EncodeBegin(begin));
  wire::Outcome outcome;
  ASSERT_TRUE(wire::DecodeOutcome(reply.body, &outcome).ok());
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;

  src_.Fill(13);
  absl::StatusOr<void*> event = (*comm)->NewEvent();
  ASSERT_TRUE(event.ok());
  const size_t region = layout_.region_bytes();
  auto send = [&](int64_t layer, std::vector<nccl::RegionRun> runs, uint32_t attempt, bool joined) {
    absl::StatusOr<nccl::HeaderSlot> slot = (*comm)->NewHeaderSlot();
    ASSERT_TRUE(slot.ok());
    nccl::MessageHeader* h = slot->host;
    std::memset(h, 0, nccl::kHeaderBytes);
    h->magic = nccl::kHeaderMagic;
    h->count = 2;
    h->transfer_id = 8;
    h->attempt = attempt;
    h->layer = static_cast<uint32_t>(layer);
    h->blocks[0] = dst[0];
    h->blocks[1] = dst[1];
    if (joined) nccl::SetJoined(h, 1);
    h->crc = Crc32c(0, h, nccl::kHeaderBytes);
    ASSERT_TRUE(
        (*comm)->EnqueueMessage(nullptr, *slot, runs, *event, absl::Now() + absl::Seconds(5)).ok());
    ASSERT_TRUE((*comm)->WaitFor(*event, absl::Now() + absl::Seconds(5), nullptr).ok());
    (*comm)->FreeHeaderSlot(*slot);
  };
  send(0, {{src_.Region(0, 0), 2 * region}}, /*attempt=*/0, /*joined=*/true);
  CompletedTransfer c = completions_.WaitFor(8, 0);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    for (int32_t b = 0; b < kBlocks; ++b) EXPECT_TRUE(dst_.IsZero(l, b)) << l << "/" << b;
  }
  // The link is still framed: the next attempt's honest messages (two runs each) land.
  begin.attempt = 1;
  exchange(nccl::kBegin, wire::EncodeBegin(begin));
  ASSERT_TRUE(wire::DecodeOutcome(reply.body, &outcome).ok());
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    send(l, {{src_.Region(l, 0), region}, {src_.Region(l, 1), region}}, /*attempt=*/1,
         /*joined=*/false);
  }
  wire::Finish finish;
  finish.transfer_id = 8;
  finish.attempt = 1;
  finish.frames = static_cast<uint64_t>(layout_.num_layers);
  finish.bytes = finish.frames * 2 * region;
  exchange(nccl::kFinish, wire::EncodeFinish(finish));
  ASSERT_TRUE(wire::DecodeOutcome(reply.body, &outcome).ok());
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_TRUE(completions_.WaitFor(8, 1).status.ok());
  EXPECT_TRUE(LandedExactly(src_, {0, 1}, dst_, dst, layout_.num_layers));
  (*comm)->FreeEvent(*event);
  receiver->CancelAndWait(8);
  comm->reset();
}

}  // namespace
}  // namespace tandem::kvtransfer
