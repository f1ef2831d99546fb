// The prefill worker's zero-copy path (prefill_worker/README.md "Zero-copy") on the emulated CUDA
// backend, with a scripted KV sender standing in for cuda-ipc: its Destination is a second
// device pool (the decode worker's, mapped) and it records the calls. A cuda-ipc target's
// transfer is begun zero-copy before the engine computes, the KV lands in the destination
// bit-identical to the copying path's, the mapping is let go once the job ended; a refusal
// (UNIMPLEMENTED) falls back to copying; a cancel during the prefill aborts the transfer only
// after the engine's final update.

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/engine/async_engine.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "prefill_worker/prefill_core.h"
#include "tests/unit/common/engine/backend/cuda/zero_copy_test_util.h"

namespace tandem {
namespace {

namespace zc = testing::zero_copy;

// A cuda-ipc sender as the prefill worker sees it: Begin, Destination, SendLayer, Finish (done
// at once, OK), Abort; with `refuse_zero_copy` a zero-copy Begin is UNIMPLEMENTED.
class ScriptedSender : public kvtransfer::KvSender {
 public:
  struct Begun {
    bool zero_copy = false;
    std::vector<int32_t> src;
    std::vector<int64_t> layers;
    bool finished = false;
    bool aborted = false;
    bool engine_busy_at_abort = false;  // the engine still had the request then
    absl::Duration deadline_in;         // the target's deadline, from Begin
    long mapping_refs_at_abort = 0;     // references to the destination's mapping then
  };

  ScriptedSender(std::shared_ptr<RemoteKvPool> pool, size_t region, const AsyncEngine* engine,
                 bool refuse_zero_copy)
      : pool_(std::move(pool)), region_(region), engine_(engine), refuse_(refuse_zero_copy) {}

  absl::StatusOr<kvtransfer::TransferHandle> Begin(const kvtransfer::TransferTarget& t,
                                                   std::vector<int32_t> src) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (t.zero_copy && refuse_) return absl::UnimplementedError("scripted refusal");
    if (t.zero_copy && !src.empty()) return absl::InvalidArgumentError("source blocks");
    Begun b;
    b.zero_copy = t.zero_copy;
    b.src = std::move(src);
    b.deadline_in = t.deadline - absl::Now();
    begun_.push_back(b);
    dst_.push_back(t.dst_blocks);
    return begun_.size();  // handle = index + 1
  }
  absl::StatusOr<kvtransfer::ZeroCopyDestination> Destination(
      kvtransfer::TransferHandle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!begun_[h - 1].zero_copy) return absl::NotFoundError("not zero-copy");
    kvtransfer::ZeroCopyDestination d;
    d.base = pool_->layer_base[0];
    d.layer_stride = zc::kRemoteBlocks * region_;
    d.block_stride = region_;
    d.blocks = dst_[h - 1];
    d.mapping = pool_->mapping;
    return d;
  }
  void SendLayer(kvtransfer::TransferHandle h, int64_t layer) override {
    std::lock_guard<std::mutex> lock(mu_);
    begun_[h - 1].layers.push_back(layer);
  }
  void Finish(kvtransfer::TransferHandle h, std::string trailer, DoneCallback done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      begun_[h - 1].finished = true;
    }
    done(absl::OkStatus());
  }
  void Abort(kvtransfer::TransferHandle h) override {
    const EngineStats s = engine_->stats();
    std::lock_guard<std::mutex> lock(mu_);
    begun_[h - 1].aborted = true;
    begun_[h - 1].engine_busy_at_abort = s.num_running + s.num_waiting > 0;
    begun_[h - 1].mapping_refs_at_abort = pool_->mapping.use_count();
  }
  int64_t num_in_flight() const override { return 0; }

  std::vector<Begun> begun() const {
    std::lock_guard<std::mutex> lock(mu_);
    return begun_;
  }

 private:
  std::shared_ptr<RemoteKvPool> pool_;
  size_t region_;
  const AsyncEngine* engine_;
  bool refuse_;
  mutable std::mutex mu_;
  std::vector<Begun> begun_;
  std::vector<std::vector<int32_t>> dst_;
};

struct PrefillResult {
  absl::Status status;
  v1::PrefillResponse response;
};

class PrefillZeroCopyTest : public ::testing::Test {
 protected:
  // `stall_ms`: each engine step first sleeps that long (a prefill a cancel can land in).
  void Start(bool refuse_zero_copy, int64_t stall_ms = 0,
             absl::Duration transfer_time = absl::Seconds(30)) {
    std::unique_ptr<Engine> e = zc::MakeCudaEngine(32, 16, 0, stall_ms);
    ASSERT_NE(e, nullptr);
    spec_ = e->backend().kv_spec();
    engine_ = std::make_unique<AsyncEngine>(std::move(e));
    pool_ = zc::MakeRemotePool(spec_);
    auto sender = std::make_unique<ScriptedSender>(pool_, spec_.bytes_per_block_layer(),
                                                   engine_.get(), refuse_zero_copy);
    sender_ = sender.get();
    core_ = std::make_unique<PrefillCore>(engine_.get(), spec_.block_size);
    core_->set_transfer_time(transfer_time);
    core_->StartSender(std::move(sender), "cuda-ipc");
  }
  void TearDown() override {
    core_.reset();
    engine_.reset();
  }

  // A 70-token prompt's prefill into the remote blocks `dst` (from block 5 - dst.size() on).
  v1::PrefillRequest Request(const std::string& id, const std::vector<int32_t>& dst) {
    v1::PrefillRequest r;
    r.set_request_id(id);
    for (int32_t t : prompt_) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_max_tokens(1);
    r.mutable_sampling()->set_temperature(0);
    v1::KvReservation* t = r.mutable_target();
    t->set_transfer_id(1);
    t->set_kv_endpoint("127.0.0.1:1");
    t->set_first_block(5 - static_cast<int32_t>(dst.size()));
    for (int32_t b : dst) t->add_dst_blocks(b);
    t->set_kv_transport("cuda-ipc");
    t->set_transfer_key(std::string(kvtransfer::kTransferKeyBytes, 'k'));
    return r;
  }

  std::future<PrefillResult> Prefill(const v1::PrefillRequest& r) {
    auto promise = std::make_shared<std::promise<PrefillResult>>();
    core_->Prefill(r, [promise](const absl::Status& st, const v1::PrefillResponse& resp) {
      promise->set_value({st, resp});
    });
    return promise->get_future();
  }

  bool EngineIdle() {
    for (int i = 0; i < 2000; ++i) {
      const EngineStats s = engine_->stats();
      if (s.kv_blocks_used == 0 && s.kv_blocks_held == 0 && s.num_running == 0) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  // Waits until only this test's pool holds the destination's mapping.
  bool MappingLetGo() {
    for (int i = 0; i < 2000 && pool_->mapping.use_count() > 1; ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return pool_->mapping.use_count() == 1;
  }

  const std::vector<int32_t> prompt_ = zc::Prompt(70, 3);
  KvCacheSpec spec_;
  std::unique_ptr<AsyncEngine> engine_;
  std::shared_ptr<RemoteKvPool> pool_;
  ScriptedSender* sender_ = nullptr;
  std::unique_ptr<PrefillCore> core_;
};

TEST_F(PrefillZeroCopyTest, KvLandsInTheDestinationAsTheCopyingPathsAndNothingIsCopied) {
  for (int64_t first_block : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "first_block " << first_block);
    Start(/*refuse_zero_copy=*/false);
    const zc::PrefillKv want = zc::CopyingPrefill(prompt_, first_block);
    std::vector<int32_t> dst = {17, 3, 9, 11, 0};
    dst.erase(dst.begin(), dst.begin() + first_block);
    PrefillResult r = Prefill(Request("zc", dst)).get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.response.first_token_ids_size(), 1);
    EXPECT_EQ(r.response.first_token_ids(0), want.first_token);
    const std::vector<ScriptedSender::Begun> begun = sender_->begun();
    ASSERT_EQ(begun.size(), 1u);
    EXPECT_TRUE(begun[0].zero_copy);
    EXPECT_TRUE(begun[0].src.empty());
    EXPECT_TRUE(begun[0].finished);
    EXPECT_FALSE(begun[0].aborted);
    ASSERT_EQ(begun[0].layers.size(), static_cast<size_t>(spec_.num_layers));
    for (int64_t l = 0; l < spec_.num_layers; ++l) EXPECT_EQ(begun[0].layers[l], l);
    KvDestination d;
    d.blocks = dst;
    d.pool = pool_;
    zc::ExpectSameKv(zc::ReadDestination(d, spec_), want, spec_, 70 % 16, "destination");
    zc::ExpectUntouched(*pool_, spec_, dst);
    EXPECT_TRUE(EngineIdle());
    EXPECT_TRUE(MappingLetGo());
    TearDown();
  }
}

TEST_F(PrefillZeroCopyTest, ARefusedZeroCopyBeginCopiesInstead) {
  Start(/*refuse_zero_copy=*/true);
  const zc::PrefillKv want = zc::CopyingPrefill(prompt_, 1);
  PrefillResult r = Prefill(Request("copy", {4, 5, 6, 7})).get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.response.first_token_ids(0), want.first_token);
  const std::vector<ScriptedSender::Begun> begun = sender_->begun();
  ASSERT_EQ(begun.size(), 1u);  // the refused zero-copy Begin took nothing
  EXPECT_FALSE(begun[0].zero_copy);
  EXPECT_EQ(begun[0].src.size(), 4u);  // the engine's own blocks 1..4
  EXPECT_TRUE(begun[0].finished);
  zc::ExpectUntouched(*pool_, spec_, {});  // nothing written into the decode worker's pool
  EXPECT_TRUE(EngineIdle());
}

// Each engine step stalls 50 ms, so the cancel lands while the engine computes the prompt's five
// chunks: the done callback answers at once, the transfer's Abort waits for the engine's final
// update (the sender sees no request left in the engine), and the mapping is let go after.
TEST_F(PrefillZeroCopyTest, ACancelAbortsTheTransferOnlyAfterTheEnginesFinalUpdate) {
  Start(/*refuse_zero_copy=*/false, /*stall_ms=*/50);
  std::future<PrefillResult> f = Prefill(Request("cancel", {1, 2, 3, 4, 5}));
  for (int i = 0; i < 1000 && engine_->stats().num_running == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(engine_->stats().num_running, 1) << "the prefill never started";
  core_->Cancel("cancel");
  const PrefillResult r = f.get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  for (int i = 0; i < 2000 && !(sender_->begun().size() == 1 && sender_->begun()[0].aborted); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::vector<ScriptedSender::Begun> begun = sender_->begun();
  ASSERT_EQ(begun.size(), 1u);
  EXPECT_TRUE(begun[0].zero_copy);
  EXPECT_TRUE(begun[0].aborted);
  EXPECT_FALSE(begun[0].finished);
  EXPECT_FALSE(begun[0].engine_busy_at_abort) << "aborted while the engine still computed";
  EXPECT_GE(begun[0].mapping_refs_at_abort, 2) << "the mapping was let go before the Abort";
  EXPECT_TRUE(EngineIdle());
  EXPECT_TRUE(MappingLetGo());
}

// A prefill still computing at its deadline (150 ms here; each of its five steps stalls 100 ms):
// the worker cancels the engine request and ends the transfer after the engine's final update;
// the transport's own deadline lies 10 s later, so it never ends the transfer first.
TEST_F(PrefillZeroCopyTest, PastItsDeadlineTheEngineRequestIsCancelledBeforeTheTransferEnds) {
  Start(/*refuse_zero_copy=*/false, /*stall_ms=*/100, absl::Milliseconds(150));
  const PrefillResult r = Prefill(Request("late", {1, 2, 3, 4, 5})).get();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  for (int i = 0; i < 2000 && !(sender_->begun().size() == 1 && sender_->begun()[0].aborted); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::vector<ScriptedSender::Begun> begun = sender_->begun();
  ASSERT_EQ(begun.size(), 1u);
  EXPECT_GT(begun[0].deadline_in, absl::Seconds(10));
  EXPECT_TRUE(begun[0].aborted);
  EXPECT_FALSE(begun[0].finished);
  EXPECT_FALSE(begun[0].engine_busy_at_abort) << "aborted while the engine still computed";
  EXPECT_GE(begun[0].mapping_refs_at_abort, 2) << "the mapping was let go before the Abort";
  EXPECT_TRUE(EngineIdle());
  EXPECT_TRUE(MappingLetGo());
}

}  // namespace
}  // namespace tandem
