// SenderCore on its own, over a fake link that records the work queued on it: Begin's checks,
// how SendLayer splits a layer, the misuse of a handle, how an attempt ends (receiver's
// verdict, Abort, deadline, a broken link, shutdown) and the counters each end leaves.

#include "kvtransfer/sender_core.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::FakePool;
using testing::SmallLayout;

class FakeLink : public SenderLink {
 public:
  void Send(SenderWork work) override {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
  }
  bool healthy() const override { return healthy_; }
  void set_healthy(bool h) { healthy_ = h; }

  std::vector<SenderWork> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(work_);
  }

 private:
  std::mutex mu_;
  std::vector<SenderWork> work_;
  std::atomic<bool> healthy_{true};
};

// A done callback whose status a test can wait for.
struct Done {
  std::promise<absl::Status> promise;
  std::future<absl::Status> future = promise.get_future();
  std::atomic<int> calls{0};
  std::thread::id thread;

  KvSender::DoneCallback Callback() {
    return [this](absl::Status s) {
      thread = std::this_thread::get_id();
      if (calls.fetch_add(1) == 0) promise.set_value(std::move(s));
    };
  }
  bool Ready(std::chrono::milliseconds wait = std::chrono::milliseconds(2000)) {
    return future.wait_for(wait) == std::future_status::ready;
  }
  absl::Status Get() { return Ready() ? future.get() : absl::InternalError("done never ran"); }
};

class SenderCoreTest : public ::testing::Test {
 protected:
  SenderCoreTest() : pool_(SmallLayout(), 16) {
    options_.layout = SmallLayout();
    options_.max_message_bytes = 2 * SmallLayout().region_bytes();  // two blocks a message
  }

  void Make(size_t max_blocks_per_message = SIZE_MAX, std::function<void()> on_tick = nullptr) {
    core_ = std::make_unique<SenderCore>(options_, &pool_, "test-send", std::move(on_tick),
                                         max_blocks_per_message);
  }

  TransferTarget Target(uint64_t id, size_t blocks, uint32_t attempt = 0) {
    TransferTarget t;
    t.endpoint = "receiver-1";
    t.incarnation = 7;
    t.transfer_id = id;
    t.attempt = attempt;
    for (size_t i = 0; i < blocks; ++i) t.dst_blocks.push_back(static_cast<int32_t>(10 - i));
    return t;
  }
  static std::vector<int32_t> Src(size_t blocks) {
    std::vector<int32_t> src;
    for (size_t i = 0; i < blocks; ++i) src.push_back(static_cast<int32_t>(i));
    return src;
  }

  TransferHandle StartOn(const std::shared_ptr<FakeLink>& link, uint64_t id, size_t blocks = 3) {
    absl::StatusOr<TransferHandle> h = core_->Start(Target(id, blocks), Src(blocks), link);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.value_or(0);
  }
  void SendAllLayers(TransferHandle h) {
    for (int64_t l = 0; l < options_.layout.num_layers; ++l) core_->SendLayer(h, l);
  }
  static std::vector<SenderWork> OfKind(std::vector<SenderWork> work, SenderWork::Kind kind) {
    std::vector<SenderWork> out;
    for (auto& w : work) {
      if (w.kind == kind) out.push_back(std::move(w));
    }
    return out;
  }

  // A link whose queued work the fixture drops at the end: queued work holds its transfer, which
  // holds the link, a cycle a real link breaks by draining its queue.
  std::shared_ptr<FakeLink> NewLink() {
    links_.push_back(std::make_shared<FakeLink>());
    return links_.back();
  }
  void TearDown() override {
    for (const std::shared_ptr<FakeLink>& link : links_) link->Take();
  }

  SenderOptions options_;
  FakePool pool_;
  std::vector<std::shared_ptr<FakeLink>> links_;
  std::shared_ptr<FakeLink> link_ = NewLink();
  std::unique_ptr<SenderCore> core_;
};

TEST_F(SenderCoreTest, CheckOptionsRefusesWhatCannotMakeASender) {
  EXPECT_TRUE(SenderCore::CheckOptions(options_, &pool_).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(SenderCore::CheckOptions(options_, nullptr)));
  SenderOptions bad = options_;
  bad.max_message_bytes = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(SenderCore::CheckOptions(bad, &pool_)));
  bad = options_;
  bad.layout.num_layers = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(SenderCore::CheckOptions(bad, &pool_)));
}

TEST_F(SenderCoreTest, CheckBeginRefusesBadBlockListsAndPassedDeadlines) {
  Make();
  EXPECT_TRUE(core_->CheckBegin(Target(1, 3), Src(3)).ok());
  absl::Status s = core_->CheckBegin(Target(1, 3), Src(2));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  std::vector<int32_t> outside = {0, 16, 1};  // the pool has blocks [0, 16)
  s = core_->CheckBegin(Target(1, 3), outside);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("16"), std::string::npos) << s;
  outside = {-1, 0, 1};
  EXPECT_TRUE(absl::IsInvalidArgument(core_->CheckBegin(Target(1, 3), outside)));
  TransferTarget late = Target(1, 3);
  late.deadline = absl::Now() - absl::Milliseconds(1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(core_->CheckBegin(late, Src(3))));
}

TEST_F(SenderCoreTest, StartRegistersTheAttemptAndQueuesItsBegin) {
  Make();
  const TransferHandle a = StartOn(link_, 1);
  const TransferHandle b = StartOn(link_, 2);
  EXPECT_NE(a, b);
  EXPECT_EQ(core_->num_in_flight(), 2);
  EXPECT_EQ(link_->live_transfers(), 2);
  EXPECT_FALSE(link_->idle());
  EXPECT_EQ(core_->stats().transfers_started, 2u);
  std::vector<SenderWork> work = link_->Take();
  ASSERT_EQ(work.size(), 2u);
  EXPECT_EQ(work[0].kind, SenderWork::Kind::kBegin);
  EXPECT_EQ(work[0].transfer->target.transfer_id, 1u);
  EXPECT_EQ(work[0].transfer->src_blocks, Src(3));
  EXPECT_EQ(work[0].transfer->link.get(), link_.get());
  EXPECT_FALSE(work[0].transfer->Ended());
  // The deadline of a target without one is bounded by max_transfer_time.
  EXPECT_LE(work[0].transfer->target.deadline, absl::Now() + options_.max_transfer_time);
}

TEST_F(SenderCoreTest, StartRefusesABrokenLinkADuplicateAndAfterShutdown) {
  Make();
  auto broken = NewLink();
  broken->set_healthy(false);
  absl::StatusOr<TransferHandle> h = core_->Start(Target(1, 3), Src(3), broken);
  EXPECT_TRUE(absl::IsUnavailable(h.status())) << h.status();
  EXPECT_TRUE(broken->Take().empty());

  StartOn(link_, 1);
  h = core_->Start(Target(1, 3), Src(3), link_);
  EXPECT_TRUE(absl::IsAlreadyExists(h.status())) << h.status();
  // Another attempt, or the same one to another receiver, is a different transfer.
  EXPECT_TRUE(core_->Start(Target(1, 3, /*attempt=*/1), Src(3), link_).ok());
  EXPECT_TRUE(core_->Start(Target(1, 3), Src(3), NewLink()).ok());

  core_->Shutdown();
  h = core_->Start(Target(9, 3), Src(3), link_);
  EXPECT_TRUE(absl::IsCancelled(h.status())) << h.status();
  EXPECT_EQ(core_->num_in_flight(), 0);
}

TEST_F(SenderCoreTest, SendLayerSplitsALayerIntoMessages) {
  Make();
  const TransferHandle h = StartOn(link_, 1, /*blocks=*/5);
  link_->Take();
  core_->SendLayer(h, 2);
  std::vector<SenderWork> work = link_->Take();
  ASSERT_EQ(work.size(), 3u);  // blocks {0, 1}, {2, 3}, {4}
  size_t next = 0;
  for (const SenderWork& w : work) {
    EXPECT_EQ(w.kind, SenderWork::Kind::kData);
    EXPECT_EQ(w.layer, 2);
    EXPECT_EQ(w.first, next);
    next += w.count;
  }
  EXPECT_EQ(next, 5u);
  EXPECT_EQ(work[2].count, 1u);

  // A transport's own bound on blocks per message wins over max_message_bytes.
  core_.reset();
  Make(/*max_blocks_per_message=*/1);
  const TransferHandle one = StartOn(link_, 1, /*blocks=*/5);
  link_->Take();
  core_->SendLayer(one, 0);
  EXPECT_EQ(link_->Take().size(), 5u);
}

TEST_F(SenderCoreTest, WindowedLayersSendOnlyTheWindowsBlocks) {
  Make();
  TransferTarget target = Target(1, 5);
  target.window_layers = {1};
  target.window_first = 3;
  absl::StatusOr<TransferHandle> h = core_->Start(target, Src(5), link_);
  ASSERT_TRUE(h.ok()) << h.status();
  link_->Take();
  core_->SendLayer(*h, 0);  // a global layer: every block
  std::vector<SenderWork> work = link_->Take();
  ASSERT_EQ(work.size(), 3u);
  EXPECT_EQ(work[0].first, 0u);
  core_->SendLayer(*h, 1);  // windowed: blocks [3, 5) only
  work = link_->Take();
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].layer, 1);
  EXPECT_EQ(work[0].first, 3u);
  EXPECT_EQ(work[0].count, 2u);

  // A window covering none of the blocks sends nothing for that layer, and Finish still goes.
  target = Target(2, 2);
  target.window_layers = {0, 1};
  target.window_first = 2;
  h = core_->Start(target, Src(2), link_);
  ASSERT_TRUE(h.ok()) << h.status();
  link_->Take();
  SendAllLayers(*h);
  work = link_->Take();
  for (const SenderWork& w : work) EXPECT_GE(w.layer, 2) << "windowed layers send nothing";
  Done done;
  core_->Finish(*h, "t", done.Callback());
  EXPECT_EQ(OfKind(link_->Take(), SenderWork::Kind::kFinish).size(), 1u);
  core_->Abort(*h);
  EXPECT_TRUE(absl::IsAborted(done.Get()));
}

TEST_F(SenderCoreTest, CheckBeginRefusesABadWindow) {
  Make();
  TransferTarget t = Target(1, 3);
  t.window_layers = {0};
  t.window_first = 3;
  EXPECT_TRUE(core_->CheckBegin(t, Src(3)).ok());
  t.window_first = 4;  // beyond the blocks
  absl::Status s = core_->CheckBegin(t, Src(3));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("window_first"), std::string::npos) << s;
  t.window_first = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(core_->CheckBegin(t, Src(3))));
  t.window_first = 1;
  t.window_layers = {options_.layout.num_layers};
  s = core_->CheckBegin(t, Src(3));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("window_layers"), std::string::npos) << s;
  t.window_layers = {1, 1};
  s = core_->CheckBegin(t, Src(3));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s;
}

TEST_F(SenderCoreTest, FinishQueuesTheTrailerAndTheReceiversOkEndsTheTransfer) {
  Make();
  const TransferHandle h = StartOn(link_, 1);
  SendAllLayers(h);
  std::shared_ptr<SenderTransfer> t = link_->Take()[0].transfer;
  // An OK before FINISH proves nothing: ignored.
  core_->OnResult(link_.get(), 1, 0, absl::OkStatus());
  EXPECT_FALSE(t->Ended());
  Done done;
  core_->Finish(h, "first tokens", done.Callback());
  std::vector<SenderWork> work = link_->Take();
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].kind, SenderWork::Kind::kFinish);
  EXPECT_EQ(work[0].trailer, "first tokens");
  EXPECT_FALSE(done.Ready(std::chrono::milliseconds(50)));
  EXPECT_EQ(core_->num_in_flight(), 1);

  core_->OnResult(link_.get(), 1, 0, absl::OkStatus());
  EXPECT_TRUE(done.Get().ok());
  EXPECT_NE(done.thread, std::this_thread::get_id()) << "done runs on the event loop";
  EXPECT_TRUE(t->Ended());
  EXPECT_EQ(core_->num_in_flight(), 0);
  EXPECT_TRUE(link_->idle());
  const TransportStats s = core_->stats();
  EXPECT_EQ(s.transfers_ok, 1u);
  EXPECT_EQ(s.transfers_failed, 0u);
  EXPECT_EQ(done.calls.load(), 1);
  // A late duplicate verdict changes nothing.
  core_->OnResult(link_.get(), 1, 0, absl::DataLossError("late"));
  EXPECT_EQ(core_->stats().transfers_failed, 0u);
}

TEST_F(SenderCoreTest, TheReceiversFailureEndsTheTransferNamingTheReceiver) {
  Make();
  const TransferHandle h = StartOn(link_, 1);
  link_->Take();
  core_->OnResult(link_.get(), 1, 0, absl::DataLossError("checksum mismatch"));
  EXPECT_TRUE(link_->Take().empty()) << "the receiver reported it: nothing to tell it";
  EXPECT_EQ(core_->num_in_flight(), 1) << "the handle lives until Finish or Abort";
  Done done;
  core_->Finish(h, "", done.Callback());
  absl::Status s = done.Get();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("receiver-1"), std::string::npos) << s;
  EXPECT_EQ(core_->num_in_flight(), 0);
  EXPECT_EQ(core_->stats().transfers_failed, 1u);
  // Verdicts for attempts it does not have (other id, attempt or link) are ignored.
  StartOn(link_, 2);
  core_->OnResult(link_.get(), 2, 1, absl::AbortedError("x"));
  core_->OnResult(NewLink().get(), 2, 0, absl::AbortedError("x"));
  EXPECT_EQ(core_->stats().transfers_failed, 1u);
}

TEST_F(SenderCoreTest, MisusedLayersFailTheTransferAndTellTheReceiver) {
  Make();
  struct Case {
    const char* name;
    std::function<void(SenderCore*, TransferHandle)> misuse;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"twice",
       [](SenderCore* c, TransferHandle h) {
         c->SendLayer(h, 1);
         c->SendLayer(h, 1);
       },
       absl::StatusCode::kInvalidArgument},
      {"out of range", [](SenderCore* c, TransferHandle h) { c->SendLayer(h, 4); },
       absl::StatusCode::kInvalidArgument},
      {"negative", [](SenderCore* c, TransferHandle h) { c->SendLayer(h, -1); },
       absl::StatusCode::kInvalidArgument},
      {"finished early",
       [](SenderCore* c, TransferHandle h) {
         c->SendLayer(h, 0);
         c->SendLayer(h, 1);
         c->SendLayer(h, 3);
       },
       absl::StatusCode::kFailedPrecondition},
  };
  uint64_t id = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const TransferHandle h = StartOn(link_, ++id);
    c.misuse(core_.get(), h);
    Done done;
    core_->Finish(h, "", done.Callback());
    const absl::Status s = done.Get();
    EXPECT_EQ(s.code(), c.code) << s;
    std::vector<SenderWork> aborts = OfKind(link_->Take(), SenderWork::Kind::kAbort);
    ASSERT_EQ(aborts.size(), 1u);
    EXPECT_EQ(aborts[0].status.code(), c.code);
    EXPECT_TRUE(aborts[0].transfer->Ended());
    EXPECT_EQ(core_->num_in_flight(), 0);
  }
  EXPECT_EQ(core_->stats().transfers_failed, cases.size());
  EXPECT_EQ(core_->stats().transfers_ok, 0u);
}

TEST_F(SenderCoreTest, FinishOnAnUnknownHandleOrTwiceAnswersOnlyThatCall) {
  Make();
  Done unknown;
  core_->Finish(12345, "", unknown.Callback());
  EXPECT_TRUE(absl::IsNotFound(unknown.Get()));

  const TransferHandle h = StartOn(link_, 1);
  SendAllLayers(h);
  Done first, second;
  core_->Finish(h, "", first.Callback());
  core_->Finish(h, "", second.Callback());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.Get()));
  EXPECT_FALSE(first.Ready(std::chrono::milliseconds(50))) << "the first Finish still waits";
  core_->OnResult(link_.get(), 1, 0, absl::OkStatus());
  EXPECT_TRUE(first.Get().ok());
  EXPECT_EQ(core_->stats().transfers_ok, 1u);
  // SendLayer and Abort on unknown handles do nothing.
  core_->SendLayer(999, 0);
  core_->Abort(999);
  EXPECT_EQ(core_->stats().transfers_failed, 0u);
}

TEST_F(SenderCoreTest, AbortEndsOnceAndTellsAHealthyReceiver) {
  Make();
  const TransferHandle before_finish = StartOn(link_, 1);
  link_->Take();
  core_->Abort(before_finish);
  EXPECT_EQ(core_->num_in_flight(), 0);
  std::vector<SenderWork> work = link_->Take();
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].kind, SenderWork::Kind::kAbort);
  EXPECT_TRUE(absl::IsAborted(work[0].status));
  EXPECT_TRUE(work[0].transfer->Ended());
  core_->Abort(before_finish);  // again: nothing
  EXPECT_TRUE(link_->Take().empty());

  const TransferHandle after_finish = StartOn(link_, 2);
  SendAllLayers(after_finish);
  Done done;
  core_->Finish(after_finish, "", done.Callback());
  core_->Abort(after_finish);
  EXPECT_TRUE(absl::IsAborted(done.Get()));
  EXPECT_EQ(core_->num_in_flight(), 0);

  // A broken link cannot carry the ABORT.
  auto broken = NewLink();
  const TransferHandle on_broken = StartOn(broken, 3);
  broken->Take();
  broken->set_healthy(false);
  core_->Abort(on_broken);
  EXPECT_TRUE(broken->Take().empty());

  const TransportStats s = core_->stats();
  EXPECT_EQ(s.transfers_started, 3u);
  EXPECT_EQ(s.transfers_failed, 3u);
  EXPECT_EQ(s.transfers_ok, 0u);
  EXPECT_EQ(done.calls.load(), 1);
}

TEST_F(SenderCoreTest, DeadlinesEndTransfersOnTheEventLoop) {
  options_.max_transfer_time = absl::Milliseconds(30);  // bounds the target without a deadline
  std::atomic<int> ticks{0};
  Make(SIZE_MAX, [&ticks] { ticks.fetch_add(1); });
  TransferTarget target = Target(1, 3);
  target.deadline = absl::Now() + absl::Milliseconds(20);
  const TransferHandle with_deadline = *core_->Start(target, Src(3), link_);
  const TransferHandle without = StartOn(link_, 2);
  SendAllLayers(with_deadline);
  SendAllLayers(without);
  Done a, b;
  core_->Finish(with_deadline, "", a.Callback());
  core_->Finish(without, "", b.Callback());
  EXPECT_TRUE(absl::IsDeadlineExceeded(a.Get()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(b.Get()));
  EXPECT_EQ(core_->stats().deadline_expired, 2u);
  EXPECT_EQ(core_->stats().transfers_failed, 2u);
  EXPECT_EQ(OfKind(link_->Take(), SenderWork::Kind::kAbort).size(), 2u);
  EXPECT_GT(ticks.load(), 0) << "the transport's housekeeping runs on the tick";
}

TEST_F(SenderCoreTest, ABrokenLinkFailsOnlyItsTransfers) {
  Make();
  auto other = NewLink();
  const TransferHandle a1 = StartOn(link_, 1);
  const TransferHandle a2 = StartOn(link_, 2);
  const TransferHandle b = StartOn(other, 3);
  link_->Take();
  other->Take();
  link_->set_healthy(false);
  core_->FailLink(link_.get(), absl::UnavailableError("connection lost"));
  EXPECT_TRUE(link_->Take().empty());
  EXPECT_TRUE(link_->idle());
  EXPECT_FALSE(other->idle());
  for (TransferHandle h : {a1, a2}) {
    SendAllLayers(h);
    Done done;
    core_->Finish(h, "", done.Callback());
    EXPECT_TRUE(absl::IsUnavailable(done.Get()));
  }
  EXPECT_EQ(core_->num_in_flight(), 1);
  EXPECT_EQ(core_->stats().transfers_failed, 2u);
  core_->Abort(b);
}

TEST_F(SenderCoreTest, DoneWaitsForAReadInProgress) {
  Make();
  const TransferHandle h = StartOn(link_, 1);
  SendAllLayers(h);
  std::shared_ptr<SenderTransfer> t = link_->Take()[0].transfer;
  ASSERT_TRUE(core_->StartRead(t));
  Done done;
  core_->Finish(h, "", done.Callback());
  core_->Abort(h);
  EXPECT_TRUE(t->Ended());
  EXPECT_FALSE(done.Ready(std::chrono::milliseconds(50))) << "the device may still read";
  EXPECT_EQ(core_->num_in_flight(), 1);
  core_->EndRead(t);
  EXPECT_TRUE(absl::IsAborted(done.Get()));
  EXPECT_EQ(core_->num_in_flight(), 0);
  EXPECT_FALSE(core_->StartRead(t)) << "nothing is read after the end";

  // Ended while reading, Finish afterwards: done still waits for the read.
  link_->Take();
  const TransferHandle h2 = StartOn(link_, 2);
  std::shared_ptr<SenderTransfer> t2 = link_->Take()[0].transfer;
  ASSERT_TRUE(core_->StartRead(t2));
  core_->End(t2, absl::UnavailableError("device error"), /*tell_receiver=*/false);
  Done done2;
  core_->Finish(h2, "", done2.Callback());
  EXPECT_FALSE(done2.Ready(std::chrono::milliseconds(50)));
  core_->EndRead(t2);
  EXPECT_TRUE(absl::IsUnavailable(done2.Get()));
  EXPECT_EQ(core_->num_in_flight(), 0);
}

TEST_F(SenderCoreTest, ShutdownAbortsEverythingAndDeliversTheDones) {
  Make();
  const TransferHandle finished = StartOn(link_, 1);
  SendAllLayers(finished);
  StartOn(link_, 2);  // never finished
  Done done;
  core_->Finish(finished, "", done.Callback());
  link_->Take();
  core_->Shutdown();
  EXPECT_TRUE(absl::IsAborted(done.Get()));
  EXPECT_EQ(core_->num_in_flight(), 0);
  EXPECT_EQ(OfKind(link_->Take(), SenderWork::Kind::kAbort).size(), 2u);
  EXPECT_EQ(core_->stats().transfers_failed, 2u);
  EXPECT_TRUE(link_->idle());
  core_->Stop();
  core_->Stop();  // idempotent
}

}  // namespace
}  // namespace tandem::kvtransfer
