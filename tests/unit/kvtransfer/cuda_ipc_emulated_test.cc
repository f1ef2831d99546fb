// The cuda-ipc transport run end to end without a GPU: built against the CPU emulator of CUDA,
// whose exportable "device" memory is a memfd another process maps (fake_cuda.h), with its
// control messages over the gRPC control channel the workers use. CUDA IPC crosses processes
// only (the runtime refuses a handle of its own process), so every case runs the receiver in a
// child process (this binary again, TANDEM_IPC_EMU_CHILD) and this process sends; the child
// checks what landed in its pool (guard bytes around every region) and exits with the verdict.
// Cases: bit-exact transfers and mapping reuse, unknown transfer and stale incarnation refused
// at Begin, the handshake refusals (layout naming the field, another emulated GPU, the shared
// secret), a restarted receiver mapped afresh, fault injection (kv_misplace) that the child's
// bit-exact check must catch, the control messages of a transfer (at most 3 each way whatever
// its length), two transfers in flight at once (the first's FINISH held), copies coalesced over
// contiguous blocks, and copies waiting on the device for the engine's event of their layer.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/control_rpc/control_rpc.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"
#include "tests/unit/kvtransfer/device_pool.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

extern char** environ;

namespace tandem::kvtransfer {
namespace {

using testing::Completions;
using testing::DevicePool;

constexpr int64_t kBlocks = 16;
constexpr char kSecret[] = "0123456789abcdef-secret";
const std::vector<int64_t> kWindowLayers = {1, 3};

// Child exit codes.
constexpr int kLandedExactly = 0;
constexpr int kLandedWrong = 3;
constexpr int kTransferFailed = 4;

// The contiguous mode's transfers: 1 moves contiguous blocks into contiguous blocks, 2 moves
// scattered ones.
const std::vector<int32_t> kContiguousSrc = {10, 11, 12}, kContiguousDst = {3, 4, 5};
const std::vector<int32_t> kScatteredSrc = {1, 3, 5}, kScatteredDst = {8, 10, 12};

// One receiver process: writes "endpoint incarnation" into its file, expects transfers 1
// ({3, 4, 5} from source blocks {10, 11, 12}) and 2 ({7} from {1}) of a pool filled with seed
// 7, and exits with the verdict once both completed (or after 60 s). With TANDEM_IPC_EMU_WINDOW
// transfer 1's layers 1 and 3 are windowed from its second block on (block 3 stays empty there).
// TANDEM_IPC_EMU_LAYERS sets the layout's layers; with TANDEM_IPC_EMU_CONTIGUOUS the pool has
// no guard bytes (a layer's blocks are adjacent) and transfer 2 is kScatteredDst from
// kScatteredSrc.
TEST(CudaIpcEmulatedChild, Receiver) {
  const char* file = std::getenv("TANDEM_IPC_EMU_CHILD");
  if (file == nullptr) GTEST_SKIP() << "runs as the child of the other cases";
  const char* secret = std::getenv("TANDEM_IPC_EMU_SECRET");
  const char* port = std::getenv("TANDEM_IPC_EMU_PORT");
  const char* layers = std::getenv("TANDEM_IPC_EMU_LAYERS");
  const bool contiguous = std::getenv("TANDEM_IPC_EMU_CONTIGUOUS") != nullptr;
  KvLayout layout = testing::SmallLayout();
  if (layers != nullptr) layout.num_layers = std::atoi(layers);
  DevicePool dst(layout, kBlocks, contiguous ? 0 : DevicePool::kGuard);
  Completions completions;
  auto control = KvControlServer::Start("127.0.0.1", port != nullptr ? std::atoi(port) : 0,
                                        TlsOptions(), secret != nullptr ? secret : "");
  ASSERT_TRUE(control.ok()) << control.status();
  ReceiverOptions ro;
  ro.transport = "cuda-ipc";
  ro.layout = layout;
  ro.name = AdvertisedEndpoint("127.0.0.1", "", (*control)->port());
  auto receiver = CreateReceiver(ro, &dst, completions.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  (*control)->SetReceiver(receiver->get());
  const bool window = std::getenv("TANDEM_IPC_EMU_WINDOW") != nullptr;
  Expectation first{1, {3, 4, 5}};
  if (window) {
    first.window_layers = kWindowLayers;
    first.window_first = 1;
  }
  (*receiver)->Expect(first);
  (*receiver)->Expect({2, contiguous ? kScatteredDst : std::vector<int32_t>{7}});
  {
    std::ofstream(std::string(file) + ".tmp")
        << (*receiver)->endpoint() << " " << (*receiver)->incarnation() << "\n";
    std::rename((std::string(file) + ".tmp").c_str(), file);
  }
  for (uint64_t id : {1, 2}) {
    CompletedTransfer c = completions.WaitFor(id, 0, absl::Seconds(60));
    if (!c.status.ok()) std::_Exit(kTransferFailed);
  }
  const bool exact = contiguous ? dst.LandedExactly(7, {10, 11, 12, 1, 3, 5}, {3, 4, 5, 8, 10, 12})
                     : window
                         ? dst.LandedExactly(7, {10, 11, 12, 1}, {3, 4, 5, 7}, kWindowLayers, {3})
                         : dst.LandedExactly(7, {10, 11, 12, 1}, {3, 4, 5, 7});
  (*control)->Stop();
  std::_Exit(exact ? kLandedExactly : kLandedWrong);
}

// The child receiver, running.
class Child {
 public:
  explicit Child(const std::string& gpu, bool secret = false, int port = 0, bool window = false,
                 int64_t layers = 0, bool contiguous = false) {
    file_ = absl::StrCat(::testing::TempDir(), "/ipc_emu_child_", getpid(), "_", ++count_);
    std::remove(file_.c_str());
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "TANDEM_EMULATED_GPU=", 20) != 0) env_strings.push_back(*e);
    }
    env_strings.push_back("TANDEM_IPC_EMU_CHILD=" + file_);
    env_strings.push_back("TANDEM_EMULATED_GPU=" + gpu);
    if (secret) env_strings.push_back(std::string("TANDEM_IPC_EMU_SECRET=") + kSecret);
    if (port != 0) env_strings.push_back(absl::StrCat("TANDEM_IPC_EMU_PORT=", port));
    if (window) env_strings.push_back("TANDEM_IPC_EMU_WINDOW=1");
    if (layers > 0) env_strings.push_back(absl::StrCat("TANDEM_IPC_EMU_LAYERS=", layers));
    if (contiguous) env_strings.push_back("TANDEM_IPC_EMU_CONTIGUOUS=1");
    std::vector<char*> env;
    for (auto& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=CudaIpcEmulatedChild.Receiver";
    char* argv[] = {self.data(), filter.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
    EXPECT_TRUE(testing::Eventually(
        [&] {
          std::ifstream in(file_);
          return static_cast<bool>(in >> endpoint_ >> incarnation_);
        },
        absl::Seconds(30)));
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(file_.c_str());
  }
  int port() const { return std::atoi(endpoint_.substr(endpoint_.rfind(':') + 1).c_str()); }
  TransferTarget Target(uint64_t id, std::vector<int32_t> dst) const {
    TransferTarget t{endpoint_, incarnation_, id, 0, std::move(dst)};
    t.deadline = absl::Now() + absl::Seconds(20);
    return t;
  }
  // The child's exit code (-1: it did not exit normally).
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

std::unique_ptr<KvSender> StartSender(const KvLayout& layout, KvRegionAccess* pool,
                                      const std::string& secret = "", double misplace = 0,
                                      TransferHooks* hooks = nullptr) {
  auto channel = MakeGrpcControlChannel(TlsOptions(), secret, absl::Seconds(10));
  EXPECT_TRUE(channel.ok()) << channel.status();
  SenderOptions so;
  so.transport = "cuda-ipc";
  so.layout = layout;
  so.io_timeout = absl::Seconds(5);
  so.control_channel = *channel;
  so.faults_from_env = false;
  so.faults.kv_misplace = misplace;
  so.hooks = hooks;
  auto s = CreateSender(so, pool);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

class CudaIpcEmulatedTest : public ::testing::Test {
 protected:
  void SetUp() override { src_.Fill(7); }
  // Sends transfers 1 and 2 the child expects.
  void SendBoth(KvSender* sender, const Child& child) {
    absl::Status first = testing::SendAll(sender, child.Target(1, {3, 4, 5}), {10, 11, 12},
                                          layout_.num_layers, "tok");
    EXPECT_TRUE(first.ok()) << first;
    absl::Status second =
        testing::SendAll(sender, child.Target(2, {7}), {1}, layout_.num_layers, "");
    EXPECT_TRUE(second.ok()) << second;
  }
  KvLayout layout_ = testing::SmallLayout();
  DevicePool src_{layout_, kBlocks};
};

TEST_F(CudaIpcEmulatedTest, TransfersBitExactIntoTheOtherProcess) {
  Child child("0");
  auto sender = StartSender(layout_, &src_);
  // Unknown transfers fail at Begin; so does a stale incarnation (a restarted receiver).
  EXPECT_EQ(sender->Begin(child.Target(99, {1}), {1}).status().code(), absl::StatusCode::kNotFound);
  TransferTarget stale = child.Target(1, {3, 4, 5});
  stale.incarnation += 1;
  EXPECT_EQ(sender->Begin(stale, {10, 11, 12}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  SendBoth(sender.get(), child);
  EXPECT_EQ(child.Wait(), kLandedExactly);
  EXPECT_EQ(sender->stats().connects, 1u);  // one connection (and mapping) for both
  EXPECT_EQ(sender->num_in_flight(), 0);
}

// Several transfers to one receiver are in flight at once: a transfer's FINISH (its copies
// waited for, then the control round trip, on the peer's finisher thread) does not hold up the
// next transfer's copies. Transfer 1's FINISH is held in the control channel; transfer 2's
// copies must be queued meanwhile, and both then land bit-exact.
TEST_F(CudaIpcEmulatedTest, TwoTransfersToOneReceiverOverlap) {
  Child child("0");
  auto grpc = MakeGrpcControlChannel(TlsOptions(), "", absl::Seconds(10));
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  std::mutex mu;
  std::condition_variable cv;
  bool first_finish_held = false, release = false;
  SenderOptions so;
  so.transport = "cuda-ipc";
  so.layout = layout_;
  so.io_timeout = absl::Seconds(5);
  so.faults_from_env = false;
  so.control_channel = [&, channel = *grpc](const std::string& endpoint, const std::string& bytes) {
    ControlRequest req;
    wire::Finish f;
    if (DecodeRequest(bytes, cuda_ipc::kConnect, cuda_ipc::kDisconnect, "cuda-ipc", &req).ok() &&
        req.kind == cuda_ipc::kFinish && wire::DecodeFinish(req.body, &f).ok() &&
        f.transfer_id == 1) {
      std::unique_lock<std::mutex> lock(mu);
      first_finish_held = true;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
    }
    return channel(endpoint, bytes);
  };
  auto created = CreateSender(so, &src_);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<KvSender> sender = *std::move(created);
  const int64_t layers = layout_.num_layers;
  absl::StatusOr<TransferHandle> h1 = sender->Begin(child.Target(1, {3, 4, 5}), {10, 11, 12});
  ASSERT_TRUE(h1.ok()) << h1.status();
  for (int64_t l = 0; l < layers; ++l) sender->SendLayer(*h1, l);
  testing::Done done1;
  sender->Finish(*h1, "tok", done1.Callback());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return first_finish_held; }));
  }
  absl::StatusOr<TransferHandle> h2 = sender->Begin(child.Target(2, {7}), {1});
  ASSERT_TRUE(h2.ok()) << h2.status();
  for (int64_t l = 0; l < layers; ++l) sender->SendLayer(*h2, l);
  testing::Done done2;
  sender->Finish(*h2, "", done2.Callback());
  // Every layer of both transfers is queued on the copy stream while transfer 1's FINISH is held.
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (sender->stats().frames < static_cast<uint64_t>(2 * layers) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const uint64_t queued_while_held = sender->stats().frames;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  EXPECT_EQ(queued_while_held, static_cast<uint64_t>(2 * layers))
      << "transfer 2's copies waited for transfer 1's FINISH";
  EXPECT_TRUE(done1.Wait().ok());
  EXPECT_TRUE(done2.Wait().ok());
  EXPECT_EQ(child.Wait(), kLandedExactly);
  EXPECT_EQ(sender->num_in_flight(), 0);
}

// Windowed layers move only the window's blocks: the sender copies nothing into the others.
TEST_F(CudaIpcEmulatedTest, WindowedLayersMoveOnlyTheWindowsBlocks) {
  Child child("0", /*secret=*/false, /*port=*/0, /*window=*/true);
  auto sender = StartSender(layout_, &src_);
  TransferTarget t = child.Target(1, {3, 4, 5});
  t.window_layers = kWindowLayers;
  t.window_first = 1;
  EXPECT_TRUE(testing::SendAll(sender.get(), t, {10, 11, 12}, layout_.num_layers, "tok").ok());
  EXPECT_TRUE(
      testing::SendAll(sender.get(), child.Target(2, {7}), {1}, layout_.num_layers, "").ok());
  EXPECT_EQ(child.Wait(), kLandedExactly);
  EXPECT_EQ(sender->stats().bytes, (4u * 3 - 2 * 1 + 4) * layout_.region_bytes());
}

// A receiver restarts on the same endpoint (new process, new incarnation): a transfer reserved
// by the old one is refused, and the new one is mapped afresh and fed.
TEST_F(CudaIpcEmulatedTest, ARestartedReceiverIsMappedAfresh) {
  auto sender = StartSender(layout_, &src_);
  TransferTarget old;
  int port = 0;
  {
    Child first("0");
    port = first.port();
    ASSERT_TRUE(testing::SendAll(sender.get(), first.Target(1, {3, 4, 5}), {10, 11, 12},
                                 layout_.num_layers, "")
                    .ok());
    old = first.Target(2, {7});
  }  // killed
  Child second("0", false, port);
  EXPECT_EQ(second.Target(2, {7}).endpoint, old.endpoint);
  EXPECT_FALSE(sender->Begin(old, {1}).ok());
  SendBoth(sender.get(), second);
  EXPECT_EQ(second.Wait(), kLandedExactly);
}

TEST_F(CudaIpcEmulatedTest, HandshakeRefusals) {
  {  // another KV layout: refused naming the field
    Child child("0");
    KvLayout other = layout_;
    other.num_kv_heads += 1;
    DevicePool other_src(other, kBlocks);
    auto sender = StartSender(other, &other_src);
    auto h = sender->Begin(child.Target(1, {3, 4, 5}), {10, 11, 12});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
    EXPECT_NE(h.status().message().find("num_kv_heads"), std::string::npos) << h.status();
    EXPECT_EQ(sender->stats().handshakes_refused, 1u);
  }
  {  // another (emulated) GPU: cuda-ipc needs both on one
    Child child("another-gpu");
    auto sender = StartSender(layout_, &src_);
    auto h = sender->Begin(child.Target(1, {3, 4, 5}), {10, 11, 12});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
    EXPECT_NE(h.status().message().find("one GPU"), std::string::npos) << h.status();
  }
  {  // the shared secret: missing and wrong refused, right accepted
    Child child("0", /*secret=*/true);
    for (const std::string& theirs : {std::string(), std::string("another-secret-0123456")}) {
      auto sender = StartSender(layout_, &src_, theirs);
      auto h = sender->Begin(child.Target(1, {3, 4, 5}), {10, 11, 12});
      EXPECT_EQ(h.status().code(), absl::StatusCode::kUnauthenticated) << h.status();
    }
    auto sender = StartSender(layout_, &src_, kSecret);
    SendBoth(sender.get(), child);
    EXPECT_EQ(child.Wait(), kLandedExactly);
  }
}

// Fault injection: the sender copies every region one block off. The transport cannot see it;
// the child's bit-exact check must (as it would catch such a bug).
TEST_F(CudaIpcEmulatedTest, ATransferLandingInTheWrongBlockFailsTheCheck) {
  Child child("0");
  auto sender = StartSender(layout_, &src_, "", /*misplace=*/1.0);
  SendBoth(sender.get(), child);
  EXPECT_EQ(child.Wait(), kLandedWrong);
}

// A transfer costs a constant number of control messages, whatever its length: BEGIN (which
// admits every region) and FINISH (which reports the copies landed), each answered. Counted by
// the metric's hook and by both sides' stats.
TEST_F(CudaIpcEmulatedTest, ATransferCostsAtMostThreeControlMessagesEachWay) {
  for (int64_t layers : {int64_t{2}, int64_t{64}}) {
    SCOPED_TRACE(absl::StrCat(layers, " layers"));
    KvLayout layout = layout_;
    layout.num_layers = layers;
    DevicePool src(layout, kBlocks);
    src.Fill(7);
    Child child("0", false, 0, false, layers);
    testing::ControlCounts hooks;
    auto sender = StartSender(layout, &src, "", 0, &hooks);
    ASSERT_TRUE(
        testing::SendAll(sender.get(), child.Target(1, {3, 4, 5}), {10, 11, 12}, layers, "tok")
            .ok());
    ASSERT_TRUE(testing::SendAll(sender.get(), child.Target(2, {7}), {1}, layers, "").ok());
    EXPECT_EQ(child.Wait(), kLandedExactly);
    const auto counts = hooks.WaitForCounts(2);
    ASSERT_EQ(counts.size(), 2u);
    for (const auto& [to_receiver, to_sender] : counts) {
      EXPECT_LE(to_receiver, 3);
      EXPECT_LE(to_sender, 3);
    }
    // The stats agree: CONNECT once, then the transfers' messages.
    const TransportStats st = sender->stats();
    EXPECT_EQ(st.connects, 1u);
    EXPECT_LE(st.control_sent - 1, 2u * 3);
    EXPECT_LE(st.control_received - 1, 2u * 3);
  }
}

// One copy call per run of blocks contiguous on both sides: a contiguous transfer costs one
// per layer, a scattered one one per block and layer.
TEST_F(CudaIpcEmulatedTest, ContiguousBlocksAreCopiedWithOneCallPerLayer) {
  DevicePool src(layout_, kBlocks, /*guard=*/0);
  src.Fill(7);
  Child child("0", false, 0, false, 0, /*contiguous=*/true);
  auto sender = StartSender(layout_, &src);
  const int64_t layers = layout_.num_layers;
  ASSERT_TRUE(
      testing::SendAll(sender.get(), child.Target(1, kContiguousDst), kContiguousSrc, layers, "")
          .ok());
  const uint64_t contiguous = sender->stats().device_copies;
  ASSERT_TRUE(
      testing::SendAll(sender.get(), child.Target(2, kScatteredDst), kScatteredSrc, layers, "")
          .ok());
  const uint64_t scattered = sender->stats().device_copies - contiguous;
  EXPECT_EQ(child.Wait(), kLandedExactly);
  EXPECT_EQ(contiguous, static_cast<uint64_t>(layers));
  EXPECT_EQ(scattered, static_cast<uint64_t>(3 * layers));
}

// The sender's pool whose layer 0 is written on an engine stream held back by a gate; the
// layer's event is recorded behind the write (what the engine does per layer).
class GatedPool : public DevicePool {
 public:
  GatedPool(const KvLayout& layout, int64_t blocks) : DevicePool(layout, blocks) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
  }
  ~GatedPool() override {
    Open();
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(event_);
    cudaStreamDestroy(stream_);
  }
  // Layer 0's regions are zero until the gate opens; then the stream writes Fill(seed)'s bytes.
  void WriteLayer0Behind(uint64_t seed) {
    for (int32_t b = 0; b < num_blocks(); ++b) std::memset(Region(0, b), 0, layout_region());
    cuda_emu::StreamEnqueueAsync(stream_, [this, seed] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
      for (int32_t b = 0; b < num_blocks(); ++b) FillRegion(seed, 0, b, Region(0, b));
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
  size_t layout_region() const { return testing::SmallLayout().region_bytes(); }
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// No host synchronization per layer: the copies of a layer wait on the device for the engine's
// event of that layer. Layer 0 is still being written when the sender is asked to send it; a
// copy that ran before the event would land zeros and fail the child's bit-exact check.
TEST_F(CudaIpcEmulatedTest, CopiesWaitForTheLayersEventOnTheDevice) {
  GatedPool src(layout_, kBlocks);
  src.Fill(7);
  src.WriteLayer0Behind(7);
  Child child("0");
  auto sender = StartSender(layout_, &src);
  auto first = sender->Begin(child.Target(1, {3, 4, 5}), {10, 11, 12});
  ASSERT_TRUE(first.ok()) << first.status();
  for (int64_t l = 0; l < layout_.num_layers; ++l) sender->SendLayer(*first, l);
  testing::Done done;
  sender->Finish(*first, "tok", done.Callback());
  // The sender's thread is not held by the wait: every layer's copies are queued meanwhile...
  ASSERT_TRUE(testing::Eventually(
      [&] { return sender->stats().frames >= static_cast<uint64_t>(layout_.num_layers); }));
  // ...and the first is not done while its layer 0 is not written.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(sender->num_in_flight(), 1);
  src.Open();
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_TRUE(
      testing::SendAll(sender.get(), child.Target(2, {7}), {1}, layout_.num_layers, "").ok());
  EXPECT_EQ(child.Wait(), kLandedExactly);
}

}  // namespace
}  // namespace tandem::kvtransfer
