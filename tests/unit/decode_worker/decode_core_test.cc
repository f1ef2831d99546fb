// DecodeCore on a running engine: the tokens of a Decode call are those of a plain engine run
// (what `tandem generate` prints), a cancelled call ends ABORT with its blocks freed, a reserved
// remote prefill that is cancelled frees its reservation (at once when no write is in flight;
// while a sender's copies are in flight it stays fenced, without stalling the engine, until the
// receiver releases it), and what cannot run is refused inside the stream.

#include "decode_worker/decode_core.h"

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "tests/unit/common/worker/worker_test_util.h"

namespace tandem {
namespace {

using testing::DecodeStream;
using testing::Greedy;
using testing::MakeEngine;
using testing::Prompt;
using testing::ReferenceTokens;

v1::DecodeRequest Request(const std::string& id, int32_t max_tokens) {
  v1::DecodeRequest r;
  r.set_request_id(id);
  for (int32_t t : Prompt()) r.add_prompt_token_ids(t);
  *r.mutable_sampling() = Greedy(max_tokens);
  return r;
}

// A real (loopback) receiver whose Cancel releases the blocks the way a cuda-ipc receiver does
// while a sender's copies admitted at BEGIN are in flight and never reported over: only when the
// test says the copies are over (the sender's FINISH or ABORT) or `hold` after the Cancel (the
// admission's end).
class CopiesInFlightReceiver : public kvtransfer::KvReceiver {
 public:
  CopiesInFlightReceiver(std::unique_ptr<kvtransfer::KvReceiver> inner, absl::Duration hold)
      : inner_(std::move(inner)), hold_(hold), thread_([this] { Run(); }) {}
  ~CopiesInFlightReceiver() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;  // nothing is released once the receiver goes
    }
    cv_.notify_all();
    thread_.join();
  }

  std::string endpoint() const override { return inner_->endpoint(); }
  uint64_t incarnation() const override { return inner_->incarnation(); }
  void Expect(const kvtransfer::Expectation& e) override { inner_->Expect(e); }
  void Cancel(uint64_t transfer_id, ReleasedCallback released) override {
    inner_->Cancel(transfer_id, nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back({absl::Now() + hold_, std::move(released)});
    cv_.notify_all();
  }
  int64_t num_in_flight() const override { return inner_->num_in_flight(); }
  // The senders' copies are over.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    release_all_ = true;
    cv_.notify_all();
  }

 private:
  struct Held {
    absl::Time until;
    ReleasedCallback released;
  };
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      for (auto it = held_.begin(); it != held_.end();) {
        if (release_all_ || it->until <= now) {
          ReleasedCallback r = std::move(it->released);
          it = held_.erase(it);
          lock.unlock();
          if (r) r();
          lock.lock();
          it = held_.begin();
        } else {
          next = std::min(next, it->until);
          ++it;
        }
      }
      release_all_ = false;
      // The lock was dropped while releasing: the destructor may have asked to stop meanwhile.
      if (stop_) break;
      if (next == absl::InfiniteFuture()) {
        cv_.wait(lock);
      } else {
        cv_.wait_for(lock, absl::ToChronoMicroseconds(next - now));
      }
    }
  }

  std::unique_ptr<kvtransfer::KvReceiver> inner_;
  const absl::Duration hold_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held> held_;
  bool release_all_ = false;
  bool stop_ = false;
  std::thread thread_;  // last
};

// Starts `core`'s receiver (loopback) as a CopiesInFlightReceiver holding releases for `hold`.
CopiesInFlightReceiver* StartHeldReceiver(DecodeCore* core, const testing::RunningEngine& running,
                                          absl::Duration hold) {
  kvtransfer::ReceiverOptions ro;
  ro.transport = "loopback";
  ro.layout = running.layout;
  CopiesInFlightReceiver* held = nullptr;
  absl::Status st = core->StartReceiver(
      ro, running.regions.get(),
      [&](const kvtransfer::ReceiverOptions& o, kvtransfer::KvRegionAccess* access,
          kvtransfer::KvReceiver::CompletionCallback done)
          -> absl::StatusOr<std::unique_ptr<kvtransfer::KvReceiver>> {
        auto inner = kvtransfer::CreateReceiver(o, access, std::move(done));
        if (!inner.ok()) return inner.status();
        auto r = std::make_unique<CopiesInFlightReceiver>(*std::move(inner), hold);
        held = r.get();
        return std::unique_ptr<kvtransfer::KvReceiver>(std::move(r));
      });
  EXPECT_TRUE(st.ok()) << st;
  return held;
}

std::vector<int32_t> ReservedBlocks(const DecodeStream& stream) {
  const v1::KvReservation r = *stream.Reservation();
  return {r.dst_blocks().begin(), r.dst_blocks().end()};
}

TEST(DecodeCoreTest, GreedyTokensEqualAPlainEngineRun) {
  AsyncEngine engine(MakeEngine());
  DecodeCore core(&engine);
  DecodeStream stream;
  core.Decode(Request("a", 24), stream.Callback());
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), ReferenceTokens(Prompt(), 24));
  const v1::SampleFinal final = stream.Final();
  EXPECT_EQ(final.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(final.usage().prompt_tokens(), static_cast<int32_t>(Prompt().size()));
  EXPECT_EQ(final.usage().completion_tokens(), 24);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(DecodeCoreTest, CancelEndsTheStreamAndFreesItsBlocks) {
  AsyncEngine engine(MakeEngine());
  DecodeCore core(&engine);
  DecodeStream stream;
  core.Decode(Request("long", 400), stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_tokens(); }));
  EXPECT_GT(engine.stats().kv_blocks_used, 0);
  core.Cancel("long", -1);
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Final().finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_LT(stream.Tokens().size(), 400u);
  // The engine publishes its stats before it delivers the final.
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.stats().num_running, 0);
}

TEST(DecodeCoreTest, ACancelledReservationFreesItsBlocksAndItsExpectation) {
  testing::RunningEngine running = testing::StartEngine();
  AsyncEngine& engine = *running.engine;
  DecodeCore core(&engine);
  kvtransfer::ReceiverOptions ro;
  ro.transport = "loopback";
  ro.layout = running.layout;
  ASSERT_TRUE(core.StartReceiver(ro, running.regions.get()).ok());
  DecodeStream stream;
  v1::DecodeRequest r = Request("remote", 8);
  r.set_remote_prefill(true);
  core.Decode(r, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const v1::KvReservation reservation = *stream.Reservation();
  EXPECT_EQ(reservation.kv_endpoint(), core.kv_endpoint());
  EXPECT_EQ(reservation.incarnation(), core.incarnation());
  EXPECT_EQ(reservation.first_block(), 0);
  EXPECT_EQ(reservation.dst_blocks_size(), 3);  // 40 tokens in 16-token blocks
  EXPECT_EQ(core.transfers_in_flight(), 1);
  EXPECT_EQ(engine.stats().num_awaiting_kv, 1);
  core.Cancel("remote", -1);
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Final().finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_TRUE(stream.Tokens().empty());
  // Nothing was in flight: the receiver released the blocks at once (freed by the next step).
  EXPECT_TRUE(testing::WaitForStats(
      engine, [](const EngineStats& s) { return s.kv_blocks_used == 0 && s.kv_blocks_held == 0; }));
  EXPECT_EQ(engine.stats().num_awaiting_kv, 0);
  EXPECT_EQ(core.transfers_in_flight(), 0);
}

// Every reservation has a random id (nothing about it follows from the incarnation or from
// another id) and a random key, and its expectation takes the transfer only from a sender that
// proves the key.
TEST(DecodeCoreTest, ReservationsCarryRandomIdsAndKeys) {
  testing::RunningEngine running = testing::StartEngine();
  DecodeCore core(running.engine.get());
  kvtransfer::ReceiverOptions ro;
  ro.transport = "loopback";
  ro.layout = running.layout;
  ASSERT_TRUE(core.StartReceiver(ro, running.regions.get()).ok());
  std::vector<v1::KvReservation> reservations;
  DecodeStream streams[2];
  for (int i = 0; i < 2; ++i) {
    v1::DecodeRequest r = Request(absl::StrCat("remote-", i), 8);
    r.set_remote_prefill(true);
    core.Decode(r, streams[i].Callback());
    ASSERT_TRUE(
        streams[i].WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
    reservations.push_back(*streams[i].Reservation());
  }
  EXPECT_NE(reservations[0].transfer_id(), reservations[1].transfer_id());
  EXPECT_NE(reservations[0].transfer_key(), reservations[1].transfer_key());
  for (const v1::KvReservation& r : reservations) {
    EXPECT_EQ(r.transfer_key().size(), kvtransfer::kTransferKeyBytes);
    // Not the incarnation-salted counter of before: the high bits are not the incarnation's.
    EXPECT_NE(r.transfer_id() >> 20, (core.incarnation() << 20) >> 20);
  }
  kvtransfer::SenderOptions so;
  so.transport = "loopback";
  so.layout = running.layout;
  auto sender = kvtransfer::CreateSender(so, running.regions.get());
  ASSERT_TRUE(sender.ok());
  kvtransfer::TransferTarget t;
  t.endpoint = reservations[0].kv_endpoint();
  t.incarnation = reservations[0].incarnation();
  t.transfer_id = reservations[0].transfer_id();
  t.dst_blocks.assign(reservations[0].dst_blocks().begin(), reservations[0].dst_blocks().end());
  auto h = (*sender)->Begin(t, t.dst_blocks);  // no key
  ASSERT_TRUE(h.ok());
  for (int64_t l = 0; l < running.layout.num_layers; ++l) (*sender)->SendLayer(*h, l);
  std::promise<absl::Status> done;
  (*sender)->Finish(*h, "", [&](absl::Status st) { done.set_value(st); });
  EXPECT_EQ(done.get_future().get().code(), absl::StatusCode::kNotFound);
  for (int i = 0; i < 2; ++i) {
    core.Cancel(absl::StrCat("remote-", i), -1);
    ASSERT_TRUE(streams[i].WaitForFinal());
  }
  EXPECT_EQ(core.transfers_in_flight(), 0);
}

// A request cancelled while its sender's copies are in flight (a sender that never finishes):
// the engine thread does not wait for them -- the stream ends at once and other requests run --
// and the reserved blocks stay out of the free list until the receiver releases them.
TEST(DecodeCoreTest, CancelDuringCopiesInFlightNeverStallsTheEngineAndFencesTheBlocks) {
  testing::RunningEngine running = testing::StartEngine();
  AsyncEngine& engine = *running.engine;
  DecodeCore core(&engine);
  CopiesInFlightReceiver* receiver = StartHeldReceiver(&core, running, absl::Seconds(4));
  ASSERT_NE(receiver, nullptr);
  DecodeStream remote;
  v1::DecodeRequest r = Request("remote", 8);
  r.set_remote_prefill(true);
  core.Decode(r, remote.Callback());
  ASSERT_TRUE(remote.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const std::vector<int32_t> fenced = ReservedBlocks(remote);
  ASSERT_EQ(fenced.size(), 3u);

  const absl::Time cancelled_at = absl::Now();
  core.Cancel("remote", -1);
  ASSERT_TRUE(remote.WaitForFinal());
  EXPECT_EQ(remote.Final().finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(1)) << "the engine waited for the sender";
  DecodeStream other;
  core.Decode(Request("other", 8), other.Callback());
  ASSERT_TRUE(other.WaitForFinal());
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(2)) << "the engine waited for the sender";
  EXPECT_EQ(other.Tokens(), ReferenceTokens(Prompt(), 8));

  // Not reused while the copies may land: held, and a new reservation (of another prompt, so
  // nothing of it is cached; the pool hands out the last freed blocks first) gets other blocks.
  EXPECT_EQ(engine.stats().kv_blocks_held, 3);
  DecodeStream next;
  v1::DecodeRequest n = Request("next", 8);
  std::reverse(n.mutable_prompt_token_ids()->begin(), n.mutable_prompt_token_ids()->end());
  n.set_remote_prefill(true);
  core.Decode(n, next.Callback());
  ASSERT_TRUE(next.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  for (int32_t b : ReservedBlocks(next)) {
    EXPECT_EQ(std::count(fenced.begin(), fenced.end(), b), 0) << "block " << b << " reused";
  }
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(3));  // all of this before the release

  // The copies are over: the blocks come back.
  receiver->Release();
  EXPECT_TRUE(testing::WaitForStats(engine, [](const EngineStats& s) {
    return s.kv_blocks_held == 0 && s.num_awaiting_kv == 1;
  }));
  core.Cancel("next", -1);
  ASSERT_TRUE(next.WaitForFinal());
  receiver->Release();
  EXPECT_TRUE(testing::WaitForStats(
      engine, [](const EngineStats& s) { return s.kv_blocks_held == 0 && s.kv_blocks_used == 0; }));
  EXPECT_EQ(core.transfers_in_flight(), 0);
}

// A sender that never reports its copies over: the blocks come back at the admission's end (the
// receiver's release), not before, and not never.
TEST(DecodeCoreTest, FencedBlocksComeBackWhenTheReceiverGivesUpOnTheSender) {
  testing::RunningEngine running = testing::StartEngine();
  AsyncEngine& engine = *running.engine;
  DecodeCore core(&engine);
  ASSERT_NE(StartHeldReceiver(&core, running, absl::Milliseconds(600)), nullptr);
  DecodeStream remote;
  v1::DecodeRequest r = Request("remote", 8);
  r.set_remote_prefill(true);
  core.Decode(r, remote.Callback());
  ASSERT_TRUE(remote.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const absl::Time cancelled_at = absl::Now();
  core.Cancel("remote", -1);
  ASSERT_TRUE(remote.WaitForFinal());
  EXPECT_EQ(engine.stats().kv_blocks_held, 3);
  EXPECT_TRUE(testing::WaitForStats(
      engine, [](const EngineStats& s) { return s.kv_blocks_held == 0 && s.kv_blocks_used == 0; }));
  EXPECT_GE(absl::Now() - cancelled_at, absl::Milliseconds(600));
}

TEST(DecodeCoreTest, RefusalsArriveAsAnErrorFinal) {
  AsyncEngine engine(MakeEngine());
  DecodeCore core(&engine);
  {
    // No KV receiver: a remote prefill cannot be served.
    DecodeStream stream;
    v1::DecodeRequest r = Request("remote", 8);
    r.set_remote_prefill(true);
    core.Decode(r, stream.Callback());
    ASSERT_TRUE(stream.WaitForFinal());
    EXPECT_EQ(stream.Final().finish_reason(), v1::FINISH_REASON_ERROR);
    EXPECT_EQ(stream.Final().error_code(),
              static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  }
  {
    // Sampling parameters the engine cannot represent.
    DecodeStream stream;
    v1::DecodeRequest r = Request("bias", 8);
    for (int i = 0; i < 1025; ++i) (*r.mutable_sampling()->mutable_logit_bias())[i] = 1.0f;
    core.Decode(r, stream.Callback());
    ASSERT_TRUE(stream.WaitForFinal());
    EXPECT_EQ(stream.Final().finish_reason(), v1::FINISH_REASON_ERROR);
    EXPECT_EQ(stream.Final().error_code(),
              static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(stream.Tokens().empty());
  }
}

}  // namespace
}  // namespace tandem
