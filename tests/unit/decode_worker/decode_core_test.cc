// DecodeCore on a running engine: the tokens of a Decode call are those of a plain engine run
// (what `tandem generate` prints), a cancelled call ends ABORT with its blocks freed, a reserved
// remote prefill that is cancelled frees its reservation, and what cannot run is refused inside
// the stream.

#include "decode_worker/decode_core.h"

#include "gtest/gtest.h"
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
