// A prefill worker's core and a decode worker's core on two engines, joined by the loopback KV
// transport, as a router drives them: Decode(remote_prefill) reserves blocks, Prefill pushes the
// prompt's KV into them layer by layer (or after the prompt) with the first token, and the
// decode side goes on. The tokens are exactly those of a plain engine run; every block is freed
// or released on both sides afterwards, and on a failed or refused prefill too.

#include "prefill_worker/prefill_core.h"

#include <future>

#include "common/cluster/transfer_key.h"
#include "decode_worker/decode_core.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "tests/unit/common/worker/worker_test_util.h"

namespace tandem {
namespace {

using testing::DecodeStream;
using testing::Greedy;
using testing::Prompt;
using testing::ReferenceTokens;
using testing::RunningEngine;
using testing::StartEngine;
using testing::WaitForStats;

struct PrefillResult {
  absl::Status status;
  v1::PrefillResponse response;
};

class DisaggregatedTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    p_ = StartEngine();
    d_ = StartEngine();
    decode_ = std::make_unique<DecodeCore>(d_.engine.get());
    kvtransfer::ReceiverOptions ro;
    ro.transport = "loopback";
    ro.layout = d_.layout;
    ASSERT_TRUE(decode_->StartReceiver(ro, d_.regions.get()).ok());
    prefill_ = std::make_unique<PrefillCore>(p_.engine.get(), p_.backend->kv_spec().block_size,
                                             /*layerwise=*/GetParam());
    kvtransfer::SenderOptions so;
    so.transport = "loopback";
    so.layout = p_.layout;
    ASSERT_TRUE(prefill_->StartSender(so, p_.regions.get()).ok());
  }

  void TearDown() override {
    prefill_.reset();
    decode_.reset();
  }

  static v1::DecodeRequest DecodeRequest(const std::string& id, int32_t max_tokens) {
    v1::DecodeRequest r;
    r.set_request_id(id);
    for (int32_t t : Prompt()) r.add_prompt_token_ids(t);
    *r.mutable_sampling() = Greedy(max_tokens);
    r.set_remote_prefill(true);
    return r;
  }

  // The Prefill call a router makes for `decode` once it has `reservation`: attempt `attempt`,
  // with that attempt's key.
  static v1::PrefillRequest PrefillRequest(const v1::DecodeRequest& decode,
                                           const v1::KvReservation& reservation,
                                           uint32_t attempt = 0) {
    v1::PrefillRequest r;
    r.set_request_id(decode.request_id());
    *r.mutable_prompt_token_ids() = decode.prompt_token_ids();
    *r.mutable_sampling() = decode.sampling();
    *r.mutable_target() = reservation;
    r.mutable_target()->set_transfer_key(TransferAttemptKey(reservation.transfer_key(), attempt));
    r.set_attempt(attempt);
    return r;
  }

  PrefillResult Prefill(const v1::PrefillRequest& request) {
    std::promise<PrefillResult> result;
    prefill_->Prefill(request, [&](const absl::Status& st, const v1::PrefillResponse& r) {
      result.set_value({st, r});
    });
    auto f = result.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return f.get();
  }

  RunningEngine p_;
  RunningEngine d_;
  std::unique_ptr<DecodeCore> decode_;
  std::unique_ptr<PrefillCore> prefill_;
};

TEST_P(DisaggregatedTest, TokensEqualAPlainEngineRunAndEveryBlockIsFreed) {
  const v1::DecodeRequest request = DecodeRequest("disagg", 24);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const PrefillResult prefill = Prefill(PrefillRequest(request, *stream.Reservation()));
  ASSERT_TRUE(prefill.status.ok()) << prefill.status;
  ASSERT_TRUE(stream.WaitForFinal());
  const std::vector<int32_t> reference = ReferenceTokens(Prompt(), 24);
  EXPECT_EQ(stream.Tokens(), reference);
  ASSERT_EQ(prefill.response.first_token_ids_size(), 1);
  EXPECT_EQ(prefill.response.first_token_ids(0), reference[0]);
  EXPECT_EQ(stream.Final().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(stream.Final().usage().completion_tokens(), 24);
  // The decode side freed its blocks when the request ended; the prefill side releases the
  // blocks it held for the export once the transfer is acknowledged.
  EXPECT_EQ(d_.engine->stats().kv_blocks_used, 0);
  EXPECT_TRUE(WaitForStats(*p_.engine, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_blocks_held == 0;
  }));
  EXPECT_EQ(prefill_->transfers_in_flight(), 0);
  EXPECT_EQ(decode_->transfers_in_flight(), 0);
}

// The TTFT split travels with the KV: the decode worker's final carries the prefill worker's
// time (from the transfer's trailer) and its own wait for the KV beyond it, here including the
// 100 ms the reservation took to reach the prefill worker (a router's part).
TEST_P(DisaggregatedTest, TheFinalCarriesTheTtftSplit) {
  const v1::DecodeRequest request = DecodeRequest("split", 4);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  absl::SleepFor(absl::Milliseconds(100));
  const PrefillResult prefill = Prefill(PrefillRequest(request, *stream.Reservation()));
  ASSERT_TRUE(prefill.status.ok()) << prefill.status;
  ASSERT_TRUE(stream.WaitForFinal());
  const v1::SampleFinal final = stream.Final();  // a copy: Final() returns by value
  const v1::Timings& t = final.timings();
  EXPECT_TRUE(t.remote()) << t.DebugString();
  EXPECT_GT(t.remote_prefill_s(), 0);
  EXPECT_DOUBLE_EQ(t.remote_prefill_s(), prefill.response.prefill_s())
      << "the trailer's time is the prefill worker's";
  EXPECT_GE(t.kv_transfer_s(), 0.1) << t.DebugString();
  // queue + remote prefill + transfer is the decode worker's arrival to verified KV: within TTFT.
  EXPECT_LE(t.queue_s() + t.remote_prefill_s() + t.kv_transfer_s(),
            t.time_to_first_token_s() + 1e-3)
      << t.DebugString();
}

TEST_P(DisaggregatedTest, AFailedPushReleasesThePrefillBlocksAndKeepsTheReservation) {
  const v1::DecodeRequest request = DecodeRequest("unreachable", 8);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  v1::KvReservation target = *stream.Reservation();
  target.set_kv_endpoint("nobody-listens-here");
  const PrefillResult failed = Prefill(PrefillRequest(request, target));
  EXPECT_FALSE(failed.status.ok());
  EXPECT_TRUE(WaitForStats(*p_.engine, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_blocks_held == 0;
  }));
  // The decode worker still waits for the KV: a retry (the next attempt) to the right endpoint
  // completes the request with the same tokens.
  EXPECT_EQ(d_.engine->stats().num_awaiting_kv, 1);
  const PrefillResult ok = Prefill(PrefillRequest(request, *stream.Reservation(), /*attempt=*/1));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), ReferenceTokens(Prompt(), 8));
}

TEST_P(DisaggregatedTest, ATargetThatDoesNotCoverThePromptIsRefused) {
  const v1::DecodeRequest request = DecodeRequest("short-target", 8);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  v1::KvReservation target = *stream.Reservation();
  target.mutable_dst_blocks()->RemoveLast();
  const PrefillResult refused = Prefill(PrefillRequest(request, target));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_EQ(p_.engine->stats().prompt_tokens, 0);  // the engine never saw it
  decode_->Cancel("short-target", -1);
  ASSERT_TRUE(stream.WaitForFinal());
  // The cancelled reservation's blocks are fenced until the receiver releases them (on its own
  // thread, then posted to the engine's): they come back soon after the final, not with it.
  EXPECT_TRUE(WaitForStats(*d_.engine, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_blocks_held == 0;
  }));
}

// The decode worker takes a transfer only from the sender proving the reservation's key: a
// reservation without the key is refused before the engine sees it, another sender with the
// id, blocks and a higher attempt but a wrong key lands nothing, and the named prefill (attempt
// 0, which the intruder's higher attempt did not make stale) gives the plain run's tokens.
TEST_P(DisaggregatedTest, OnlyTheSenderWithTheReservationsKeyLands) {
  const v1::DecodeRequest request = DecodeRequest("keyed", 8);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const v1::KvReservation reservation = *stream.Reservation();
  ASSERT_EQ(reservation.transfer_key().size(), kvtransfer::kTransferKeyBytes);

  v1::KvReservation keyless = reservation;
  keyless.clear_transfer_key();
  const PrefillResult refused = Prefill(PrefillRequest(request, keyless));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_NE(refused.status.message().find("transfer_key"), std::string::npos) << refused.status;
  EXPECT_EQ(p_.engine->stats().prompt_tokens, 0);

  kvtransfer::SenderOptions so;
  so.transport = "loopback";
  so.layout = p_.layout;
  auto intruder = kvtransfer::CreateSender(so, p_.regions.get());
  ASSERT_TRUE(intruder.ok()) << intruder.status();
  kvtransfer::TransferTarget t;
  t.endpoint = reservation.kv_endpoint();
  t.incarnation = reservation.incarnation();
  t.transfer_id = reservation.transfer_id();
  t.attempt = 5;
  t.dst_blocks.assign(reservation.dst_blocks().begin(), reservation.dst_blocks().end());
  t.transfer_key = std::string(kvtransfer::kTransferKeyBytes, 'x');
  auto handle = (*intruder)->Begin(t, t.dst_blocks);
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (int64_t l = 0; l < p_.layout.num_layers; ++l) (*intruder)->SendLayer(*handle, l);
  std::promise<absl::Status> intruded;
  (*intruder)->Finish(*handle, "", [&](absl::Status st) { intruded.set_value(st); });
  const absl::Status st = intruded.get_future().get();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;

  const PrefillResult ok = Prefill(PrefillRequest(request, reservation));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), ReferenceTokens(Prompt(), 8));
}

INSTANTIATE_TEST_SUITE_P(Push, DisaggregatedTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Layerwise" : "WholePrompt";
                         });

}  // namespace
}  // namespace tandem
