// DecodeCore on a running engine: the tokens of a Decode call are those of a plain engine run
// (what `tandem generate` prints), a cancelled call ends ABORT with its blocks freed, a reserved
// remote prefill that is cancelled frees its reservation, and what cannot run is refused inside
// the stream.

#include "decode_worker/decode_core.h"

#include <future>

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
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
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
