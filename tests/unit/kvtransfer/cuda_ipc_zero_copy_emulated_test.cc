// The cuda-ipc transport's zero-copy transfers (kvtransfer/README.md, "Zero-copy on one GPU") on
// the CPU emulator of CUDA, the receiver in a child process (this binary again,
// TANDEM_ZC_EMU_CHILD) whose pool this process maps: the "engine" here writes the KV straight
// into the receiver's blocks at the transfer's Destination, on a stream of its own held back by
// a gate with one event per layer (as the engine records them), and the transport copies
// nothing. Cases: the KV lands bit-exact with no device copy and at most 3 control messages each
// way; FINISH waits for the engine's events; ABORT waits for the engine's writes in flight;
// fault injection kv_misplace (the destination one block off) caught by the child's bit-exact
// check; the receiver killed mid-transfer; and the refusals that make the caller copy instead
// (UNIMPLEMENTED: blocks not one region apart, windowed layers, another transport).

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/control_rpc/control_rpc.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/device_pool.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

extern char** environ;

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::DevicePool;

constexpr int64_t kBlocks = 16;
constexpr int kLandedExactly = 0;
constexpr int kLandedWrong = 3;
constexpr int kTransferFailed = 4;
// What the engine would have written into the sender's own blocks {10, 11, 12}: the child
// checks its blocks {3, 4, 5} hold those bytes.
const std::vector<int32_t> kSrc = {10, 11, 12}, kDst = {3, 4, 5};

// The receiver: its pool's blocks one region apart (TANDEM_ZC_EMU_GUARD: with guard bytes
// between them, which zero-copy cannot address); expects transfer 1 into kDst and exits with
// the verdict once it completed.
TEST(CudaIpcZeroCopyChild, Receiver) {
  const char* file = std::getenv("TANDEM_ZC_EMU_CHILD");
  if (file == nullptr) GTEST_SKIP() << "runs as the child of the other cases";
  const bool guard = std::getenv("TANDEM_ZC_EMU_GUARD") != nullptr;
  DevicePool dst(testing::SmallLayout(), kBlocks, guard ? DevicePool::kGuard : 0);
  Completions completions;
  auto control = KvControlServer::Start("127.0.0.1", 0, TlsOptions(), "");
  ASSERT_TRUE(control.ok()) << control.status();
  ReceiverOptions ro;
  ro.transport = "cuda-ipc";
  ro.layout = testing::SmallLayout();
  ro.name = AdvertisedEndpoint("127.0.0.1", "", (*control)->port());
  auto receiver = CreateReceiver(ro, &dst, completions.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  (*control)->SetReceiver(receiver->get());
  Expectation expect;
  expect.transfer_id = 1;
  expect.dst_blocks = kDst;
  (*receiver)->Expect(expect);
  {
    std::ofstream(std::string(file) + ".tmp")
        << (*receiver)->endpoint() << " " << (*receiver)->incarnation() << "\n";
    std::rename((std::string(file) + ".tmp").c_str(), file);
  }
  CompletedTransfer c = completions.WaitFor(1, 0, absl::Seconds(60));
  if (!c.status.ok()) std::_Exit(kTransferFailed);
  const bool exact = dst.LandedExactly(7, kSrc, kDst);
  (*control)->Stop();
  std::_Exit(exact ? kLandedExactly : kLandedWrong);
}

class ZeroCopyChild {
 public:
  explicit ZeroCopyChild(bool guard = false) {
    file_ = absl::StrCat(::testing::TempDir(), "/zc_emu_child_", getpid(), "_", ++count_);
    std::remove(file_.c_str());
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
    env_strings.push_back("TANDEM_ZC_EMU_CHILD=" + file_);
    if (guard) env_strings.push_back("TANDEM_ZC_EMU_GUARD=1");
    std::vector<char*> env;
    for (auto& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=CudaIpcZeroCopyChild.Receiver";
    char* argv[] = {self.data(), filter.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
    EXPECT_TRUE(testing::Eventually(
        [&] {
          std::ifstream in(file_);
          return static_cast<bool>(in >> endpoint_ >> incarnation_);
        },
        absl::Seconds(30)));
  }
  ~ZeroCopyChild() {
    Kill();
    std::remove(file_.c_str());
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  TransferTarget Target(bool zero_copy = true) const {
    TransferTarget t;
    t.endpoint = endpoint_;
    t.incarnation = incarnation_;
    t.transfer_id = 1;
    t.dst_blocks = kDst;
    t.deadline = absl::Now() + absl::Seconds(20);
    t.zero_copy = zero_copy;
    return t;
  }
  int Wait() {
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  static inline int count_ = 0;
  std::string file_;
  pid_t pid_ = 0;
  std::string endpoint_;
  uint64_t incarnation_ = 0;
};

// The sender's side: its own pool (unused by zero-copy transfers) and the engine's stream,
// which writes a transfer's regions at its Destination behind a gate and records one event per
// layer after that layer's writes (KvRegionAccess::LayerReadyEvent).
class EnginePool : public DevicePool {
 public:
  EnginePool() : DevicePool(testing::SmallLayout(), kBlocks, 0) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    events_.resize(testing::SmallLayout().num_layers);
    for (auto& e : events_) {
      EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    }
  }
  ~EnginePool() override {
    Open();
    cudaStreamSynchronize(stream_);
    for (auto e : events_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }
  // Enqueues the writes of every layer of `d` (what Fill(7) holds in kSrc), each behind the gate.
  void WriteBehindGate(const ZeroCopyDestination& d) {
    const size_t region = testing::SmallLayout().region_bytes();
    for (int64_t l = 0; l < static_cast<int64_t>(events_.size()); ++l) {
      cuda_emu::StreamEnqueueAsync(stream_, [this, d, l, region] {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return open_; });
        for (size_t i = 0; i < d.blocks.size(); ++i) {
          std::vector<uint8_t> bytes(region);
          FillRegion(7, l, kSrc[i], bytes.data());
          std::memcpy(d.base + l * d.layer_stride + d.blocks[i] * d.block_stride, bytes.data(),
                      region);
        }
      });
      EXPECT_EQ(cudaEventRecord(events_[l], stream_), cudaSuccess);
    }
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void* LayerReadyEvent(int64_t layer) override { return events_[layer]; }
  void Synchronize() { cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class CudaIpcZeroCopyTest : public ::testing::Test {
 protected:
  // A cuda-ipc sender over the gRPC control channel; `aborts` counts the ABORTs it sent.
  std::unique_ptr<KvSender> Sender(double misplace = 0, TransferHooks* hooks = nullptr) {
    auto grpc = MakeGrpcControlChannel(TlsOptions(), "", absl::Seconds(10));
    EXPECT_TRUE(grpc.ok()) << grpc.status();
    SenderOptions so;
    so.transport = "cuda-ipc";
    so.layout = testing::SmallLayout();
    so.io_timeout = absl::Seconds(5);
    so.faults_from_env = false;
    so.faults.kv_misplace = misplace;
    so.hooks = hooks;
    so.control_channel = [this, channel = *grpc](const std::string& endpoint,
                                                 const std::string& bytes) {
      ControlRequest req;
      if (DecodeRequest(bytes, cuda_ipc::kConnect, cuda_ipc::kDisconnect, "cuda-ipc", &req).ok() &&
          req.kind == cuda_ipc::kAbort) {
        aborts_.fetch_add(1);
      }
      return channel(endpoint, bytes);
    };
    auto s = CreateSender(so, &engine_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  // Begins the zero-copy transfer, has the engine write it (the gate still closed) and queues
  // every layer and FINISH; `done` answers it.
  TransferHandle WriteAndFinish(KvSender* sender, const ZeroCopyChild& child, testing::Done* done) {
    absl::StatusOr<TransferHandle> h = sender->Begin(child.Target(), {});
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return 0;
    absl::StatusOr<ZeroCopyDestination> d = sender->Destination(*h);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return *h;
    engine_.WriteBehindGate(*d);
    for (int64_t l = 0; l < testing::SmallLayout().num_layers; ++l) sender->SendLayer(*h, l);
    sender->Finish(*h, "tok", done->Callback());
    return *h;
  }

  EnginePool engine_;
  std::atomic<int> aborts_{0};
};

// The engine's writes are the transfer: no copy call, the child finds its blocks bit-exact, and
// the transfer costs BEGIN and FINISH (at most 3 control messages each way). The copying path
// of the same transfer costs a copy per layer (device_copies), so this fails on it.
TEST_F(CudaIpcZeroCopyTest, TheEnginesWritesLandWithoutACopy) {
  ZeroCopyChild child;
  testing::ControlCounts hooks;
  auto sender = Sender(0, &hooks);
  testing::Done done;
  WriteAndFinish(sender.get(), child, &done);
  engine_.Open();
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_EQ(child.Wait(), kLandedExactly);
  const TransportStats st = sender->stats();
  EXPECT_EQ(st.device_copies, 0u);
  EXPECT_EQ(st.bytes,
            3u * testing::SmallLayout().num_layers * testing::SmallLayout().region_bytes());
  const auto counts = hooks.WaitForCounts(1);
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_LE(counts[0].first, 3);
  EXPECT_LE(counts[0].second, 3);
  EXPECT_EQ(sender->num_in_flight(), 0);
}

// FINISH says the sender's writes are over: it waits (on the copy stream, behind the engine's
// layer events) until the engine's writes completed. The child would find zeros otherwise.
TEST_F(CudaIpcZeroCopyTest, FinishWaitsForTheEnginesEvents) {
  ZeroCopyChild child;
  auto sender = Sender();
  testing::Done done;
  WriteAndFinish(sender.get(), child, &done);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(sender->num_in_flight(), 1) << "FINISH went out before the engine's writes";
  engine_.Open();
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_EQ(child.Wait(), kLandedExactly);
}

// A zero-copy transfer aborted while the engine's writes of it are still queued (a request
// cancelled during an early chunk: no layer was sent yet): the receiver hears ABORT (and may
// reuse the blocks) only once every layer's writes enqueued by then completed.
TEST_F(CudaIpcZeroCopyTest, AbortWaitsForTheEnginesWritesInFlight) {
  ZeroCopyChild child;
  auto sender = Sender();
  absl::StatusOr<TransferHandle> h = sender->Begin(child.Target(), {});
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<ZeroCopyDestination> d = sender->Destination(*h);
  ASSERT_TRUE(d.ok()) << d.status();
  engine_.WriteBehindGate(*d);
  sender->Abort(*h);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(aborts_.load(), 0) << "ABORT went out while the engine still wrote the blocks";
  engine_.Open();
  EXPECT_TRUE(testing::Eventually([&] { return aborts_.load() == 1; }));
  EXPECT_EQ(sender->Destination(*h).status().code(), absl::StatusCode::kNotFound);
}

// Fault injection: the destination handed to the engine is one block off. The transport cannot
// see it; the child's bit-exact check must.
TEST_F(CudaIpcZeroCopyTest, ADestinationOneBlockOffFailsTheCheck) {
  ZeroCopyChild child;
  auto sender = Sender(/*misplace=*/1.0);
  testing::Done done;
  WriteAndFinish(sender.get(), child, &done);
  engine_.Open();
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_EQ(child.Wait(), kLandedWrong);
}

// The receiver dies mid-transfer: the engine's writes still go to valid memory (the caller
// holds the mapping through its destination), and the transfer fails.
TEST_F(CudaIpcZeroCopyTest, AReceiverKilledMidTransferFailsIt) {
  auto sender = Sender();
  ZeroCopyChild child;
  absl::StatusOr<TransferHandle> h = sender->Begin(child.Target(), {});
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<ZeroCopyDestination> d = sender->Destination(*h);
  ASSERT_TRUE(d.ok()) << d.status();
  engine_.WriteBehindGate(*d);
  sender->SendLayer(*h, 0);
  child.Kill();
  engine_.Open();
  engine_.Synchronize();
  for (int64_t l = 1; l < testing::SmallLayout().num_layers; ++l) sender->SendLayer(*h, l);
  testing::Done done;
  sender->Finish(*h, "", done.Callback());
  EXPECT_FALSE(done.Wait().ok());
  EXPECT_EQ(sender->num_in_flight(), 0);
}

// Where the engine cannot write the receiver's blocks, Begin refuses zero-copy (UNIMPLEMENTED,
// nothing of the transfer sent) and the same attempt then copies.
TEST_F(CudaIpcZeroCopyTest, RefusedWhereItDoesNotApplyAndTheCopyingPathTakesOver) {
  {  // the receiver's blocks are not one region apart
    ZeroCopyChild child(/*guard=*/true);
    auto sender = Sender();
    auto h = sender->Begin(child.Target(), {});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kUnimplemented) << h.status();
    EXPECT_NE(h.status().message().find("apart"), std::string::npos) << h.status();
    engine_.Fill(7);
    EXPECT_TRUE(testing::SendAll(sender.get(), child.Target(/*zero_copy=*/false), kSrc,
                                 testing::SmallLayout().num_layers, "")
                    .ok());
    EXPECT_EQ(child.Wait(), kLandedExactly);
  }
  {  // windowed layers
    ZeroCopyChild child;
    auto sender = Sender();
    TransferTarget t = child.Target();
    t.window_layers = {1};
    t.window_first = 1;
    EXPECT_EQ(sender->Begin(t, {}).status().code(), absl::StatusCode::kUnimplemented);
    // Source blocks with a zero-copy target are a caller's error.
    EXPECT_EQ(sender->Begin(child.Target(), kSrc).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  {  // another transport copies
    testing::FakePool pool(testing::SmallLayout(), kBlocks);
    SenderOptions so;
    so.transport = "loopback";
    so.layout = testing::SmallLayout();
    auto loopback = CreateSender(so, &pool);
    ASSERT_TRUE(loopback.ok()) << loopback.status();
    TransferTarget t;
    t.endpoint = "nowhere";
    t.incarnation = 1;
    t.transfer_id = 1;
    t.dst_blocks = kDst;
    t.zero_copy = true;
    auto h = (*loopback)->Begin(t, {});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kUnimplemented) << h.status();
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
