// GenerateCall through GenerationService on an in-process gRPC server, with a fake
// InferenceClient in place of the workers: the test plays the worker side (token and final
// responses, in the order it chooses) and reads what a Generate client receives. Covers
// streaming, stop strings spanning tokens, characters split across tokens, n > 1, worker errors
// mapped to the call's status, cancellation both ways, and requests refused before any worker
// sees them.

#include "tests/unit/router/generate_call_fixture.h"

namespace tandem {
namespace testing_generate_call {
namespace {

TEST_F(GenerateCallTest, StreamsDetokenizedChunksAndTheFinal) {
  auto call = Start(TextRequest("The answer is"));
  const v1::DecodeRequest sent = client_.WaitForRequest();
  // The workers know the call by an id of its own, never the client's (scoped by tenant).
  EXPECT_NE(sent.request_id(), "r1");
  EXPECT_EQ(sent.request_id().rfind("req-", 0), 0u) << sent.request_id();
  EXPECT_EQ(sent.n(), 1);
  EXPECT_EQ(sent.sampling().max_tokens(), 8);
  const std::vector<int32_t> prompt = Ids("The answer is");
  EXPECT_EQ(std::vector<int32_t>(sent.prompt_token_ids().begin(), sent.prompt_token_ids().end()),
            prompt);

  const std::vector<int32_t> out = Ids(" forty two");
  ASSERT_GE(out.size(), 2u);
  for (int32_t id : out) client_.Tokens(0, {id});
  client_.Final(0, v1::FINISH_REASON_LENGTH, static_cast<int32_t>(out.size()));

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " forty two");
  EXPECT_EQ(got.TokenIds(0), out);
  ASSERT_EQ(got.Finals().size(), 1u);
  const v1::GenerateFinal f = got.Finals()[0];
  EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(f.usage().completion_tokens(), static_cast<int32_t>(out.size()));
  EXPECT_DOUBLE_EQ(f.timings().time_to_first_token_s(), 0.125);
  EXPECT_TRUE(f.stop_string().empty());
  for (const auto& r : got.responses) EXPECT_EQ(r.request_id(), "r1");
  EXPECT_TRUE(client_.cancels().empty());
}

TEST_F(GenerateCallTest, StopStringSpanningTokensEndsTheSample) {
  v1::GenerateRequest request = TextRequest("Say");
  request.mutable_sampling()->add_stop("lo wor");
  auto call = Start(request);
  client_.WaitForRequest();
  const std::vector<int32_t> hello = Ids(" Hello");
  const std::vector<int32_t> world = Ids(" world");
  ASSERT_EQ(hello.size(), 1u);
  ASSERT_EQ(world.size(), 1u);
  // " Hello" ends in "lo", which may start the stop string: " Hel" goes out, "lo" waits.
  client_.Tokens(0, hello);
  client_.Tokens(0, world);
  // The call cancels the sample at the worker; its final (ABORT) still ends it.
  ASSERT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), 0));
  client_.Tokens(0, Ids("!"));  // in flight before the cancel: dropped
  client_.Final(0, v1::FINISH_REASON_ABORT, 3);

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " Hel");
  ASSERT_EQ(got.Finals().size(), 1u);
  const v1::GenerateFinal f = got.Finals()[0];
  EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(f.stop_string(), "lo wor");
  EXPECT_EQ(f.usage().completion_tokens(), 2) << "tokens up to the stop, not the worker's count";
}

TEST_F(GenerateCallTest, HeldBackTextIsReleasedAtTheEnd) {
  v1::GenerateRequest request = TextRequest("Say");
  request.mutable_sampling()->add_stop("lo wor");
  auto call = Start(request);
  client_.WaitForRequest();
  client_.Tokens(0, Ids(" Hello"));
  client_.Final(0, v1::FINISH_REASON_LENGTH, 1);

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " Hello") << "the held-back 'lo' comes with the end of the sample";
  ASSERT_EQ(got.Finals().size(), 1u);
  EXPECT_EQ(got.Finals()[0].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(client_.cancels().empty());
}

TEST_F(GenerateCallTest, CharacterSplitAcrossTokensIsNeverSentInPart) {
  auto call = Start(TextRequest("Smile"));
  client_.WaitForRequest();
  const std::vector<int32_t> ids = Ids(" 🙂🙂");
  ASSERT_GT(ids.size(), 2u) << "the emoji should take several byte tokens";
  for (int32_t id : ids) client_.Tokens(0, {id});
  client_.Final(0, v1::FINISH_REASON_STOP, static_cast<int32_t>(ids.size()));

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " 🙂🙂");
  EXPECT_EQ(got.TokenIds(0), ids) << "every token id is streamed, text or not";
  int empty_chunks = 0;
  for (const auto& r : got.responses) {
    if (!r.has_chunk()) continue;
    EXPECT_TRUE(IsValidUtf8(r.chunk().text())) << "a chunk ends inside a character";
    empty_chunks += r.chunk().text().empty();
  }
  EXPECT_GT(empty_chunks, 0) << "the first byte of a character carries no text";
}

TEST_F(GenerateCallTest, StopStringWithMultiByteCharacters) {
  v1::GenerateRequest request = TextRequest("Smile");
  request.mutable_sampling()->add_stop("🙂");
  request.mutable_sampling()->set_include_stop_str_in_output(true);
  auto call = Start(request);
  client_.WaitForRequest();
  const std::vector<int32_t> ids = Ids(" ok🙂 more");
  for (int32_t id : ids) client_.Tokens(0, {id});
  ASSERT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), 0));
  client_.Final(0, v1::FINISH_REASON_ABORT, static_cast<int32_t>(ids.size()));

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " ok🙂");
  ASSERT_EQ(got.Finals().size(), 1u);
  EXPECT_EQ(got.Finals()[0].finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.Finals()[0].stop_string(), "🙂");
}

TEST_F(GenerateCallTest, SeveralSamplesEachStopOnTheirOwn) {
  v1::GenerateRequest request = TextRequest("Count");
  request.set_n(2);
  request.mutable_sampling()->add_stop(" three");
  request.mutable_sampling()->add_stop("!");
  auto call = Start(request);
  const v1::DecodeRequest sent = client_.WaitForRequest();
  EXPECT_EQ(sent.n(), 2);
  ASSERT_EQ(sent.sampling().stop_size(), 2);

  client_.Tokens(1, Ids(" one"));
  client_.Tokens(0, Ids(" two"));
  client_.Tokens(0, Ids(" three"));  // sample 0 stops; sample 1 goes on
  ASSERT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), 0));
  client_.Tokens(1, Ids(" four"));
  client_.Final(0, v1::FINISH_REASON_ABORT, 2);
  client_.Tokens(1, Ids("!"));
  ASSERT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), 1));
  client_.Final(1, v1::FINISH_REASON_ABORT, 3);

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " two");
  EXPECT_EQ(got.Text(1), " one four");
  const auto finals = got.Finals();
  ASSERT_EQ(finals.size(), 2u);
  EXPECT_EQ(finals[0].index(), 0);
  EXPECT_EQ(finals[0].stop_string(), " three");
  EXPECT_EQ(finals[1].index(), 1);
  EXPECT_EQ(finals[1].stop_string(), "!");
  for (const auto& f : finals) EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_STOP);
}

TEST_F(GenerateCallTest, TheStreamEndsOnlyAfterEverySampleFinished) {
  v1::GenerateRequest request = TextRequest("Count");
  request.set_n(2);
  auto call = Start(request);
  client_.WaitForRequest();
  client_.Tokens(0, Ids(" a"));
  client_.Final(0, v1::FINISH_REASON_LENGTH, 1);
  client_.Tokens(1, Ids(" b"));
  client_.Tokens(1, Ids(" c"));
  client_.Final(1, v1::FINISH_REASON_STOP, 2);

  const Received got = call->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " a");
  EXPECT_EQ(got.Text(1), " b c");
  ASSERT_EQ(got.Finals().size(), 2u);
  EXPECT_EQ(got.Finals()[0].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(got.Finals()[1].finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_TRUE(got.responses.back().has_final());
}

TEST_F(GenerateCallTest, WorkerErrorBecomesTheCallStatus) {
  auto call = Start(TextRequest("Hi"));
  client_.WaitForRequest();
  client_.Tokens(0, Ids(" there"));
  client_.Error(static_cast<int32_t>(grpc::StatusCode::RESOURCE_EXHAUSTED), "KV cache is full");

  const Received got = call->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(got.status.error_message(), "KV cache is full");
  EXPECT_EQ(got.Text(0), " there") << "what was streamed before the error stays streamed";
  EXPECT_TRUE(got.Finals().empty());
}

TEST_F(GenerateCallTest, ErrorWithoutCodeIsInternalAndCancelsTheOtherSamples) {
  v1::GenerateRequest request = TextRequest("Hi");
  request.set_n(2);
  auto call = Start(request);
  client_.WaitForRequest();
  client_.Error(0, "worker lost");
  const Received got = call->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(got.status.error_message(), "worker lost");
  EXPECT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), -1));
}

TEST_F(GenerateCallTest, ClientCancellationReachesTheWorkers) {
  auto call = Start(TextRequest("Hi"));
  client_.WaitForRequest();
  client_.Tokens(0, Ids(" there"));
  call->context.TryCancel();
  EXPECT_TRUE(client_.WaitForCancel(client_.WaitForRequest().request_id(), -1))
      << "the workers are never told";
  client_.Final(0, v1::FINISH_REASON_ABORT, 1);  // after the call ended: ignored
  const Received got = call->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GenerateCallTest, InvalidRequestsNeverReachTheClient) {
  v1::GenerateRequest too_many = TextRequest("Hi");
  too_many.set_n(5);
  Received got = Start(too_many)->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("n: must be in [1, 4]"), std::string::npos)
      << got.status.error_message();

  v1::GenerateRequest stops = TextRequest("Hi");
  for (int i = 0; i < 3; ++i) stops.mutable_sampling()->add_stop("x");
  got = Start(stops)->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::GenerateRequest bad_token = TextRequest("Hi");
  bad_token.mutable_token_ids()->add_ids(1 << 30);
  got = Start(bad_token)->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::GenerateRequest other_model = TextRequest("Hi");
  other_model.set_model("other");
  got = Start(other_model)->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::NOT_FOUND);

  EXPECT_EQ(client_.requests(), 0u);
}

TEST_F(GenerateCallTest, ARunningRequestIdIsRefused) {
  auto first = Start(TextRequest("Hi"));
  client_.WaitForRequest();
  const Received second = Start(TextRequest("Hi"))->Finish();
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(client_.requests(), 1u);
  EXPECT_TRUE(client_.cancels().empty()) << "the refused call must not cancel the running one";
  client_.Final(0, v1::FINISH_REASON_LENGTH, 0);
  EXPECT_TRUE(first->Finish().status.ok());
}

}  // namespace
}  // namespace testing_generate_call
}  // namespace tandem
