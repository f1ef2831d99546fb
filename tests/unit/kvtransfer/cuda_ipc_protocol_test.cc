// The cuda-ipc receiver driven by hand-written control messages (its KvControl requests), in
// this process on the CPU emulator: the handshake refusals (a layout mismatch naming the field,
// a sender on another GPU, garbage), the WELCOME that carries the exported pool, admission of
// copies (unknown transfer, foreign block, a copy before BEGIN), the sender binding (only the
// sender proving the transfer's key drives it), and Cancel waiting for an admitted copy until
// the sender reports it landed.

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/transfer_key.h"
#include "common/engine/backend/cuda/emulation/fake_cuda.h"
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
                     uint64_t sender = kSender, uint32_t attempt = 0, uint64_t binder = 0) {
    wire::Begin b;
    b.transfer_id = id;
    b.attempt = attempt;
    b.incarnation = receiver_->incarnation();
    b.dst_blocks = std::move(dst);
    if (!key.empty()) {  // `key`: the transfer's key; a sender proves with its attempt's key
      b.proof =
          BeginProof(TransferAttemptKey(key, attempt),
                     ControlBinding(binder != 0 ? binder : sender), id, attempt, b.dst_blocks);
    }
    return ReplyStatus(Send(ControlKind::kBegin, wire::EncodeBegin(b), sender));
  }
  absl::Status Data(uint64_t id, uint32_t layer, std::vector<int32_t> blocks,
                    uint64_t sender = kSender) {
    wire::DataMeta d;
    d.transfer_id = id;
    d.layer = layer;
    d.payload_len = blocks.size() * layout_.region_bytes();
    d.blocks = std::move(blocks);
    return ReplyStatus(Send(ControlKind::kData, wire::EncodeDataMeta(d), sender));
  }
  absl::Status Landed(uint64_t id, uint64_t sender = kSender) {
    return ReplyStatus(
        Send(ControlKind::kLanded, wire::EncodeOutcome({id, 0, absl::OkStatus()}), sender));
  }
  // FINISH after `frames` DATA messages of `regions` regions in all.
  absl::Status Finish(uint64_t id, uint64_t frames, uint64_t regions, const std::string& trailer,
                      uint64_t sender = kSender) {
    wire::Finish f{id, 0, frames, regions * layout_.region_bytes(), trailer};
    return ReplyStatus(Send(ControlKind::kFinish, wire::EncodeFinish(f), sender));
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

  EXPECT_FALSE(receiver_->HandleControl("x").ok());
  EXPECT_FALSE(receiver_->HandleControl(std::string(9, '\x01')).ok());  // an nccl kind
  // Nothing is admitted for a sender that never connected.
  receiver_->Expect({1, {2}});
  EXPECT_EQ(Begin(1, {2}).code(), absl::StatusCode::kUnavailable);
  receiver_->Cancel(1);
}

TEST_F(CudaIpcProtocolTest, OnlyExpectedRegionsAreAdmitted) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({1, {2, 3}});
  EXPECT_EQ(Data(1, 0, {2}).code(), absl::StatusCode::kNotFound);  // before BEGIN
  EXPECT_EQ(Begin(9, {2}).code(), absl::StatusCode::kNotFound);    // unknown transfer
  ASSERT_TRUE(Begin(1, {2, 3}).ok());
  EXPECT_EQ(Data(9, 0, {2}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Data(1, 0, {5}).code(), absl::StatusCode::kInvalidArgument);  // foreign block
  // The foreign block failed the attempt: its outcome reaches the receiver's user.
  EXPECT_FALSE(completions_.WaitFor(1, 0).status.ok());
  receiver_->Cancel(1);
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

TEST_F(CudaIpcProtocolTest, AFullTransferCompletes) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({4, {6}});
  ASSERT_TRUE(Begin(4, {6}).ok());
  for (uint32_t l = 0; l < layout_.num_layers; ++l) {
    ASSERT_TRUE(Data(4, l, {6}).ok());
    ASSERT_TRUE(Landed(4).ok());
  }
  EXPECT_TRUE(Finish(4, layout_.num_layers, layout_.num_layers, "t").ok());
  CompletedTransfer c = completions_.WaitFor(4, 0);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "t");
}

// Another connected sender (it passed KvControl's proofs) that knows the transfer's id and
// blocks but not its key: its BEGIN (none, or the named sender's proof replayed, with a higher
// attempt) is refused telling nothing, and its DATA, LANDED, FINISH and ABORT for the named
// sender's attempt change nothing; the named sender's transfer completes.
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
  EXPECT_EQ(Data(6, 0, {1, 2}, kIntruder).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Data(6, 0, {1, 2}).ok());    // the named sender's copy
  EXPECT_TRUE(Landed(6, kIntruder).ok());  // answered, but lands nothing
  EXPECT_EQ(Finish(6, 1, 2, "x", kIntruder).code(), absl::StatusCode::kNotFound);
  Send(ControlKind::kAbort, wire::EncodeOutcome({6, 0, absl::AbortedError("stop")}), kIntruder);
  ASSERT_TRUE(Landed(6).ok());
  for (uint32_t l = 1; l < layout_.num_layers; ++l) {
    ASSERT_TRUE(Data(6, l, {1, 2}).ok());
    ASSERT_TRUE(Landed(6).ok());
  }
  EXPECT_TRUE(Finish(6, layout_.num_layers, 2 * layout_.num_layers, "named").ok());
  CompletedTransfer c = completions_.WaitFor(6, 0);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.trailer, "named");
  EXPECT_GE(receiver_->stats().messages_refused, 5u);
}

// Cancel must not return while an admitted copy may still write the blocks.
TEST_F(CudaIpcProtocolTest, CancelWaitsForTheCopyInFlight) {
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({3, {1}});
  ASSERT_TRUE(Begin(3, {1}).ok());
  ASSERT_TRUE(Data(3, 0, {1}).ok());  // admitted: the sender copies now
  std::atomic<bool> cancelled{false};
  std::thread cancel([&] {
    receiver_->Cancel(3);
    cancelled = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(cancelled) << "Cancel returned with a copy in flight";
  ASSERT_TRUE(Landed(3).ok());
  cancel.join();
  EXPECT_TRUE(cancelled);
  EXPECT_EQ(Data(3, 1, {1}).code(), absl::StatusCode::kNotFound);  // nothing more is admitted
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

// A sender that vanished mid-copy (or whose LANDED was lost) holds Cancel up to the copy's
// deadline (io_timeout after admission), not forever.
TEST_F(CudaIpcProtocolTest, CancelGivesUpOnACopyNeverReportedLanded) {
  Start(absl::Milliseconds(400));
  ASSERT_EQ(Connect(device_, layout_).type, wire::FrameType::kWelcome);
  receiver_->Expect({5, {2}});
  ASSERT_TRUE(Begin(5, {2}).ok());
  const absl::Time before_admission = absl::Now();
  ASSERT_TRUE(Data(5, 0, {2}).ok());
  receiver_->Cancel(5);
  // Not before the copy's deadline; and it returned at all.
  EXPECT_GE(absl::Now() - before_admission, absl::Milliseconds(400));
  EXPECT_EQ(receiver_->num_in_flight(), 0);
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
