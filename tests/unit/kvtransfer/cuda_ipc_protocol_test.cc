// The cuda-ipc receiver (protocol 2) driven by hand-written control messages (its KvControl
// requests), in this process on the CPU emulator: the handshake refusals (a layout mismatch
// naming the field, a sender on another GPU, a sender of protocol 1, garbage), the WELCOME that
// carries the exported pool, admission at BEGIN (unknown transfer, blocks other than the
// expectation's, protocol 1's per-layer DATA refused), FINISH's check of what the sender
// copied, the sender binding (only the sender proving the transfer's key drives it), and Cancel
// returning at once but releasing the blocks only once the copies admitted at BEGIN are over
// (the sender's FINISH or ABORT, its peer going, or the admission's end).

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cluster/transfer_key.h"
#include "common/cuda/emulation/fake_cuda.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

constexpr int64_t kBlocks = 8;
constexpr uint64_t kSender = 77;

// The KV pool in one exportable emulated device allocation.
class DevicePool : public KvRegionAccess {
 public:
  explicit DevicePool(const KvLayout& layout) : region_(layout.region_bytes()) {
    bytes_ = std::max<size_t>(layout.num_layers * kBlocks * region_, cuda_emu::kIpcMinBytes);
    EXPECT_EQ(cudaMalloc(&base_, bytes_), cudaSuccess);
  }
  ~DevicePool() override { cudaFree(base_); }
  uint8_t* Region(int64_t layer, int32_t block) override {
    return static_cast<uint8_t*>(base_) + (layer * kBlocks + block) * region_;
  }
  int64_t num_blocks() const override { return kBlocks; }

 private:
  size_t region_;
  size_t bytes_ = 0;
  void* base_ = nullptr;
};

class CudaIpcProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(absl::Seconds(20)); }
  void Start(absl::Duration io_timeout) {
    receiver_.reset();
    ReceiverOptions ro;
    ro.transport = "cuda-ipc";
    ro.layout = layout_;
    ro.io_timeout = io_timeout;
    auto r = CreateReceiver(ro, &pool_, completions_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
  }

  ControlReply Send(ControlKind kind, const std::string& body, uint64_t sender = kSender) {
    absl::StatusOr<std::string> bytes =
        receiver_->HandleControl(EncodeRequest({kind, sender, body}));
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    ControlReply reply;
    EXPECT_TRUE(DecodeReply(bytes.ok() ? *bytes : "", &reply).ok());
    return reply;
  }
  ControlReply Connect(const std::string& device, const KvLayout& layout,
                       uint64_t sender = kSender) {
    wire::Hello hello;
    hello.layout = layout;
    return Send(ControlKind::kConnect, EncodeConnect(device, hello), sender);
  }
  // BEGIN of attempt `attempt`, proving `key` bound to `binder`'s id (none when empty).
  absl::Status Begin(uint64_t id, std::vector<int32_t> dst, const std::string& key = "",
                     uint64_t sender = kSender, uint32_t attempt = 0, uint64_t binder = 0,
                     int64_t deadline_ms = -1) {
    wire::Begin b;
    b.transfer_id = id;
    b.attempt = attempt;
    b.incarnation = receiver_->incarnation();
    b.deadline_ms = deadline_ms;
    b.dst_blocks = std::move(dst);
    if (!key.empty()) {  // `key`: the transfer's key; a sender proves with its attempt's key
      b.proof =
          BeginProof(TransferAttemptKey(key, attempt),
                     ControlBinding(binder != 0 ? binder : sender), id, attempt, b.dst_blocks);
    }
    return ReplyStatus(Send(ControlKind::kBegin, wire::EncodeBegin(b), sender));
  }
  // FINISH after `frames` DATA items of `regions` regions in all.
  absl::Status Finish(uint64_t id, uint64_t frames, uint64_t regions, const std::string& trailer,
                      uint64_t sender = kSender, uint32_t attempt = 0) {
    wire::Finish f{id, attempt, frames, regions * layout_.region_bytes(), trailer};
    return ReplyStatus(Send(ControlKind::kFinish, wire::EncodeFinish(f), sender));
  }
  absl::Status Abort(uint64_t id, uint64_t sender = kSender, uint32_t attempt = 0) {
    return ReplyStatus(Send(ControlKind::kAbort,
                            wire::EncodeOutcome({id, attempt, absl::AbortedError("stop")}),
                            sender));
  }

  KvLayout layout_ = testing::SmallLayout();
  DevicePool pool_{layout_};
  testing::Completions completions_;
  std::unique_ptr<KvReceiver> receiver_;
  std::string device_ = *DeviceId(0);
};

TEST_F(CudaIpcProtocolTest, WelcomeCarriesTheExportedPool) {
  ControlReply reply = Connect(device_, layout_);
  ASSERT_EQ(reply.type, wire::FrameType::kWelcome);
  wire::Welcome welcome;
  PoolExport pool;
  ASSERT_TRUE(DecodeWelcomeBody(reply.body, &welcome, &pool).ok());
  EXPECT_EQ(welcome.incarnation, receiver_->incarnation());
  EXPECT_EQ(pool.handle.size(), kIpcHandleBytes);
  EXPECT_EQ(pool.device, device_);
  EXPECT_EQ(pool.num_blocks, kBlocks);
  EXPECT_EQ(pool.block_stride, layout_.region_bytes());
  EXPECT_EQ(pool.layer_stride, kBlocks * layout_.region_bytes());
  EXPECT_EQ(pool.pool_bytes, layout_.num_layers * kBlocks * layout_.region_bytes());
}

TEST_F(CudaIpcProtocolTest, HandshakeRefusals) {
  KvLayout other = layout_;
  other.head_dim *= 2;
  ControlReply reply = Connect(device_, other);
  EXPECT_EQ(reply.type, wire::FrameType::kRefuse);
  absl::Status s = ReplyStatus(reply);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s;

  reply = Connect("GPU-00000000-0000-0000-0000-000000000000", layout_);
  EXPECT_EQ(reply.type, wire::FrameType::kRefuse);
  s = ReplyStatus(reply);
  EXPECT_NE(s.message().find("one GPU"), std::string::npos) << s;
  EXPECT_EQ(receiver_->stats().handshakes_refused, 2u);

  // Protocol 1's CONNECT (no protocol field: the HELLO follows the device id) is refused
  // naming the protocol, not misread.
  wire::Hello hello;
  hello.layout = layout_;
  std::string v1;
  const uint32_t n = static_cast<uint32_t>(device_.size());
  v1.append(reinterpret_cast<const char*>(&n), 4);
  v1 += device_ + wire::EncodeHello(hello);
  reply = Send(ControlKind::kConnect, v1);
  EXPECT_EQ(reply.type, wire::FrameType::kRefuse);
  s = ReplyStatus(reply);
  EXPECT_NE(s.message().find("cuda-ipc protocol 1"), std::string::npos) << s;
  EXPECT_EQ(receiver_->stats().handshakes_refused, 3u);

  EXPECT_FALSE(receiver_->HandleControl("x").ok());
  EXPECT_FALSE(receiver_->HandleControl(std::string(9, '\x01')).ok());  // an nccl kind
  // Nothing is admitted for a sender that never connected.
  receiver_->Expect({1, {2}});
  EXPECT_EQ(Begin(1, {2}).code(), absl::StatusCode::kUnavailable);
  receiver_->CancelAndWait(1);
}

// A protocol-2 sender refuses a receiver of protocol 1 (its WELCOME ends after the device id).
TEST_F(CudaIpcProtocolTest, SenderRefusesAProtocol1Welcome) {
  ControlReply reply = Connect(device_, layout_);
  ASSERT_EQ(reply.type, wire::FrameType::kWelcome);
  wire::Welcome welcome;
  PoolExport pool;
  const std::string v1 = reply.body.substr(0, reply.body.size() - 4);
  absl::Status s = DecodeWelcomeBody(v1, &welcome, &pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("cuda-ipc protocol 1"), std::string::npos) << s;
}

TEST_F(CudaIpcProtocolTest, BeginAdmitsOnlyTheExpectedRegions) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({1, {2, 3}});
  EXPECT_EQ(Finish(1, 1, 2, "early").code(), absl::StatusCode::kNotFound);  // before BEGIN
  EXPECT_EQ(Begin(9, {2}).code(), absl::StatusCode::kNotFound);             // unknown transfer
  EXPECT_EQ(Begin(1, {2, 5}).code(), absl::StatusCode::kInvalidArgument);   // a foreign block
  // Protocol 1's per-layer admission is gone: refused, nothing admitted by it.
  wire::DataMeta d;
  d.transfer_id = 1;
  d.blocks = {2};
  d.payload_len = layout_.region_bytes();
  EXPECT_FALSE(
      receiver_
          ->HandleControl(EncodeRequest({ControlKind::kDataV1, kSender, wire::EncodeDataMeta(d)}))
          .ok());
  ASSERT_TRUE(Begin(1, {2, 3}).ok());
  // A second BEGIN of the live attempt admits nothing twice.
  EXPECT_FALSE(Begin(1, {2, 3}).ok());
  ASSERT_TRUE(Abort(1).ok());  // the sender's copies are over
  receiver_->CancelAndWait(1);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

TEST_F(CudaIpcProtocolTest, AFullTransferIsBeginAndFinish) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  const TransportStats before = receiver_->stats();
  receiver_->Expect({4, {6, 7}});
  ASSERT_TRUE(Begin(4, {6, 7}).ok());
  EXPECT_TRUE(Finish(4, layout_.num_layers, 2 * layout_.num_layers, "t").ok());
  CompletedTransfer c = completions_.WaitFor(4, 0);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "t");
  const TransportStats after = receiver_->stats();
  EXPECT_EQ(after.control_received - before.control_received, 2u);
  EXPECT_EQ(after.control_sent - before.control_sent, 2u);
  EXPECT_EQ(after.bytes - before.bytes, 2 * layout_.num_layers * layout_.region_bytes());
}

// FINISH reports what the sender copied: less than BEGIN admitted is DATA_LOSS.
TEST_F(CudaIpcProtocolTest, FinishWithFewerBytesThanAdmittedIsDataLoss) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({4, {6, 7}});
  ASSERT_TRUE(Begin(4, {6, 7}).ok());
  absl::Status s = Finish(4, layout_.num_layers, 2 * layout_.num_layers - 1, "t");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(completions_.WaitFor(4, 0).status.code(), absl::StatusCode::kDataLoss);
}

// Another connected sender (it passed KvControl's proofs) that knows the transfer's id and
// blocks but not its key: its BEGIN (none, or the named sender's proof replayed, with a higher
// attempt) is refused telling nothing, and its FINISH and ABORT for the named sender's attempt
// change nothing; the named sender's transfer completes.
TEST_F(CudaIpcProtocolTest, OnlyTheNamedSenderDrivesATransfer) {
  constexpr uint64_t kIntruder = 78;
  const std::string key(kTransferKeyBytes, 'k');
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  ASSERT_EQ(Connect(device_, layout_, kIntruder).type, wire::FrameType::kWelcome);
  receiver_->Expect({6, {1, 2}, {}, 0, key});
  absl::Status s = Begin(6, {1, 2}, "", kIntruder, /*attempt=*/3);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message().find("expects"), std::string::npos) << s;
  EXPECT_EQ(Begin(6, {1, 2}, key, kIntruder, 3, /*binder=*/kSender).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Begin(6, {1, 2}, std::string(kTransferKeyBytes, 'x'), kIntruder, 3).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Begin(6, {1, 2}, key).ok());
  EXPECT_EQ(Finish(6, 1, 2 * layout_.num_layers, "x", kIntruder).code(),
            absl::StatusCode::kNotFound);
  Abort(6, kIntruder).IgnoreError();
  EXPECT_TRUE(Finish(6, layout_.num_layers, 2 * layout_.num_layers, "named").ok());
  CompletedTransfer c = completions_.WaitFor(6, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "named");
  EXPECT_GE(receiver_->stats().messages_refused, 4u);
}

// Cancel never waits for the sender (the decode worker calls it on its engine thread), but it
// must not release the blocks while the copies admitted at BEGIN may still write them: the
// sender's FINISH or ABORT reports them over.
TEST_F(CudaIpcProtocolTest, CancelReleasesOnlyOnceTheCopiesInFlightAreOver) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  for (bool finish : {true, false}) {
    const uint64_t id = finish ? 3 : 13;
    receiver_->Expect({id, {1}});
    ASSERT_TRUE(Begin(id, {1}).ok());  // admitted: the sender copies now
    testing::ReleaseProbe released;
    const absl::Time before = absl::Now();
    receiver_->Cancel(id, released.Callback());
    EXPECT_LT(absl::Now() - before, absl::Milliseconds(100)) << "Cancel waited for the sender";
    EXPECT_EQ(receiver_->num_in_flight(), 0);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(released.calls(), 0) << "released with copies in flight";
    if (finish) {
      EXPECT_FALSE(Finish(id, layout_.num_layers, layout_.num_layers, "late").ok());
    } else {
      EXPECT_TRUE(Abort(id).ok());
    }
    EXPECT_TRUE(released.WaitFor(absl::Seconds(5)));
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(released.calls(), 1);
    EXPECT_EQ(Begin(id, {1}, "", kSender, 1).code(), absl::StatusCode::kNotFound);
  }
  // Nothing in flight: released before Cancel returns.
  receiver_->Expect({4, {2}});
  testing::ReleaseProbe released;
  receiver_->Cancel(4, released.Callback());
  EXPECT_EQ(released.calls(), 1);
}

// A newer attempt (another sender: the router retried) completes while the older attempt's
// sender may still copy into the same blocks (its copies were admitted at BEGIN and not reported
// over): the sender of the newer attempt hears OK at once, but the blocks are handed over
// (on_complete) only once the older copies are over -- its ABORT or FINISH, its peer going, or
// its admission's end -- and a Cancel meanwhile delivers nothing.
TEST_F(CudaIpcProtocolTest, NewerAttemptCompletesOnlyOnceTheOlderAttemptsCopiesAreOver) {
  constexpr uint64_t kRetry = 79;
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  ASSERT_EQ(Connect(device_, layout_, kRetry).type, wire::FrameType::kWelcome);
  const uint64_t regions = 2 * layout_.num_layers;
  // The old sender's ABORT, its FINISH, a Cancel, the old sender's peer replaced (it reconnects).
  for (int end = 0; end < 4; ++end) {
    const uint64_t id = 20 + end;
    receiver_->Expect({id, {1, 2}});
    ASSERT_TRUE(Begin(id, {1, 2}, "", kSender, /*attempt=*/0).ok());  // copies admitted
    ASSERT_TRUE(Begin(id, {1, 2}, "", kRetry, /*attempt=*/1).ok());
    EXPECT_EQ(completions_.WaitFor(id, 0).status.code(), absl::StatusCode::kAborted);
    const absl::Time before = absl::Now();
    EXPECT_TRUE(Finish(id, layout_.num_layers, regions, "new", kRetry, 1).ok());
    EXPECT_LT(absl::Now() - before, absl::Seconds(1)) << "the newer sender's FINISH waited";
    EXPECT_EQ(completions_.WaitFor(id, 1, absl::Milliseconds(300)).status.code(),
              absl::StatusCode::kUnknown)
        << "completed while the older attempt's copies may still land, end " << end;
    if (end == 2) {
      testing::ReleaseProbe released;
      receiver_->Cancel(id, released.Callback());
      absl::SleepFor(absl::Milliseconds(100));
      EXPECT_EQ(released.calls(), 0) << "released with the older copies in flight";
      EXPECT_TRUE(Abort(id, kSender, 0).ok());
      EXPECT_TRUE(released.WaitFor(absl::Seconds(5)));
      absl::SleepFor(absl::Milliseconds(100));
      EXPECT_EQ(completions_.WaitFor(id, 1, absl::Milliseconds(1)).status.code(),
                absl::StatusCode::kUnknown)
          << "on_complete after Cancel";
      continue;
    }
    if (end == 0) {
      EXPECT_TRUE(Abort(id, kSender, 0).ok());
    } else if (end == 1) {
      Finish(id, layout_.num_layers, regions, "old", kSender, 0).IgnoreError();
    } else {
      ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
    }
    CompletedTransfer c = completions_.WaitFor(id, 1);
    EXPECT_TRUE(c.status.ok()) << c.status << ", end " << end;
    EXPECT_EQ(c.trailer, "new");
  }
}

// An older sender that went silent (died, or its ABORT was lost) holds the newer attempt's
// completion only until its admission's end (its deadline plus io_timeout).
TEST_F(CudaIpcProtocolTest, NewerAttemptCompletesAtTheOlderAdmissionsEndWithoutItsSender) {
  constexpr uint64_t kRetry = 79;
  Start(absl::Milliseconds(300));
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  ASSERT_EQ(Connect(device_, layout_, kRetry).type, wire::FrameType::kWelcome);
  receiver_->Expect({30, {4}});
  const absl::Time first_begin = absl::Now();
  ASSERT_TRUE(Begin(30, {4}, "", kSender, 0, 0, /*deadline_ms=*/200).ok());
  ASSERT_TRUE(Begin(30, {4}, "", kRetry, 1).ok());
  ASSERT_TRUE(Finish(30, layout_.num_layers, layout_.num_layers, "new", kRetry, 1).ok());
  CompletedTransfer c = completions_.WaitFor(30, 1, absl::Seconds(5));
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_GE(absl::Now() - first_begin, absl::Milliseconds(500));
}

// A sender that vanished mid-transfer (or whose FINISH and ABORT were lost) holds the release up
// to its admission's end (the attempt's deadline, then io_timeout), not forever; Cancel itself
// returns at once.
TEST_F(CudaIpcProtocolTest, CancelReleasesAtTheAdmissionsEndWithoutTheSender) {
  Start(absl::Milliseconds(300));
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({5, {2}});
  const absl::Time before_admission = absl::Now();
  ASSERT_TRUE(Begin(5, {2}, "", kSender, 0, 0, /*deadline_ms=*/200).ok());
  testing::ReleaseProbe released;
  receiver_->Cancel(5, released.Callback());
  EXPECT_LT(absl::Now() - before_admission, absl::Milliseconds(150));
  ASSERT_TRUE(released.WaitFor(absl::Seconds(5)));
  // Not before the admission's end.
  EXPECT_GE(absl::Now() - before_admission, absl::Milliseconds(500));
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

// The sender's peer going (a reconnect) also ends its admitted copies.
TEST_F(CudaIpcProtocolTest, CancelReleasesWhenTheSendersPeerGoes) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({8, {3}});
  ASSERT_TRUE(Begin(8, {3}).ok());
  testing::ReleaseProbe released;
  receiver_->Cancel(8, released.Callback());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(released.calls(), 0);
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);  // the sender again
  EXPECT_TRUE(released.WaitFor(absl::Seconds(5)));
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
