// GenerateCall through GenerationService on an in-process gRPC server, with a fake
// InferenceClient in place of the workers: the test plays the worker side (token and final
// responses, in the order it chooses) and reads what a Generate client receives. Covers
// streaming, stop strings spanning tokens, characters split across tokens, n > 1, worker errors
// mapped to the call's status, cancellation both ways, and requests refused before any worker
// sees them.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "router/generation_service.h"
#include "router/inference_client.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {
namespace {

constexpr auto kWait = std::chrono::seconds(10);

// Stands in for the workers: records what the call asks and lets the test answer.
class FakeClient : public InferenceClient {
 public:
  void Decode(const v1::DecodeRequest& request, ResponseCallback callback) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
    callback_ = std::move(callback);
    cv_.notify_all();
  }
  void Cancel(const std::string& request_id, int32_t index) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.emplace_back(request_id, index);
    cv_.notify_all();
  }

  // The request the call sent (waits for it).
  v1::DecodeRequest WaitForRequest() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, kWait, [&] { return !requests_.empty(); }))
        << "the call never reached the client";
    return requests_.empty() ? v1::DecodeRequest() : requests_.back();
  }
  // Waits for a Cancel(request_id, index).
  bool WaitForCancel(const std::string& request_id, int32_t index) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] {
      for (const auto& c : cancels_) {
        if (c.first == request_id && c.second == index) return true;
      }
      return false;
    });
  }
  std::vector<std::pair<std::string, int32_t>> cancels() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  // Drops the calls' callbacks (each holds its call), before the server goes.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    callback_ = nullptr;
  }
  size_t requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.size();
  }

  // Worker responses, on the test's thread (the client's thread, for the call).
  void Tokens(int32_t index, const std::vector<int32_t>& ids) {
    v1::DecodeResponse r;
    r.mutable_tokens()->set_index(index);
    for (int32_t id : ids) r.mutable_tokens()->add_token_ids(id);
    Send(r);
  }
  void Final(int32_t index, v1::FinishReason reason, int32_t completion_tokens) {
    v1::DecodeResponse r;
    r.mutable_final()->set_index(index);
    r.mutable_final()->set_finish_reason(reason);
    r.mutable_final()->mutable_usage()->set_completion_tokens(completion_tokens);
    r.mutable_final()->mutable_timings()->set_time_to_first_token_s(0.125);
    Send(r);
  }
  void Error(int32_t code, const std::string& message) {
    v1::DecodeResponse r;
    r.mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
    r.mutable_final()->set_error_code(code);
    r.mutable_final()->set_error_message(message);
    Send(r);
  }

 private:
  void Send(const v1::DecodeResponse& r) {
    ResponseCallback callback;
    {
      std::lock_guard<std::mutex> lock(mu_);
      callback = callback_;
    }
    ASSERT_TRUE(callback != nullptr);
    callback(r);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::DecodeRequest> requests_;
  ResponseCallback callback_;
  std::vector<std::pair<std::string, int32_t>> cancels_;
};

// What one Generate call delivered to its client.
struct Received {
  std::vector<v1::GenerateResponse> responses;
  grpc::Status status;

  std::string Text(int32_t index) const {
    std::string text;
    for (const auto& r : responses) {
      if (r.has_chunk() && r.chunk().index() == index) text += r.chunk().text();
    }
    return text;
  }
  std::vector<int32_t> TokenIds(int32_t index) const {
    std::vector<int32_t> ids;
    for (const auto& r : responses) {
      if (r.has_chunk() && r.chunk().index() == index) {
        ids.insert(ids.end(), r.chunk().token_ids().begin(), r.chunk().token_ids().end());
      }
    }
    return ids;
  }
  std::vector<v1::GenerateFinal> Finals() const {
    std::vector<v1::GenerateFinal> finals;
    for (const auto& r : responses) {
      if (r.has_final()) finals.push_back(r.final());
    }
    return finals;
  }
};

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xE  ? 3
                       : (c >> 3) == 0x1E ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

class GenerateCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer =
        Tokenizer::FromModelDir(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tokenizers/gpt2");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value();
    GenerationServiceOptions options;
    options.model_name = "m";
    options.max_n = 4;
    options.max_stop_strings = 2;
    service_ = std::make_unique<GenerationService>(options, tokenizer_.get(), &client_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Generation::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    client_.Reset();
  }

  // Token ids of `text` (no special tokens), one piece per call.
  std::vector<int32_t> Ids(const std::string& text) {
    auto ids = tokenizer_->Encode(text, false);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  // Starts a Generate call; Finish() reads everything it delivers.
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;

    Received Finish() {
      Received got;
      v1::GenerateResponse r;
      while (reader->Read(&r)) got.responses.push_back(r);
      got.status = reader->Finish();
      return got;
    }
  };
  std::unique_ptr<Call> Start(const v1::GenerateRequest& request) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call->reader = stub_->Generate(&call->context, request);
    return call;
  }
  v1::GenerateRequest TextRequest(const std::string& text) {
    v1::GenerateRequest request;
    request.set_request_id("r1");
    request.set_text(text);
    request.mutable_sampling()->set_max_tokens(8);
    return request;
  }

  FakeClient client_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(GenerateCallTest, StreamsDetokenizedChunksAndTheFinal) {
  auto call = Start(TextRequest("The answer is"));
  const v1::DecodeRequest sent = client_.WaitForRequest();
  EXPECT_EQ(sent.request_id(), "r1");
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
  ASSERT_TRUE(client_.WaitForCancel("r1", 0));
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
  ASSERT_TRUE(client_.WaitForCancel("r1", 0));
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
  ASSERT_TRUE(client_.WaitForCancel("r1", 0));
  client_.Tokens(1, Ids(" four"));
  client_.Final(0, v1::FINISH_REASON_ABORT, 2);
  client_.Tokens(1, Ids("!"));
  ASSERT_TRUE(client_.WaitForCancel("r1", 1));
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
  EXPECT_TRUE(client_.WaitForCancel("r1", -1));
}

TEST_F(GenerateCallTest, ClientCancellationReachesTheWorkers) {
  auto call = Start(TextRequest("Hi"));
  client_.WaitForRequest();
  client_.Tokens(0, Ids(" there"));
  call->context.TryCancel();
  EXPECT_TRUE(client_.WaitForCancel("r1", -1)) << "the workers are never told";
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
}  // namespace tandem
