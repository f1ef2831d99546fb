#pragma once

// The fixture of the GenerateCall tests: GenerationService on an in-process gRPC server with a
// fake InferenceClient in place of the workers (the test plays the worker side) and helpers
// that read what a Generate client receives.

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
#include "tests/util/test_paths.h"

namespace tandem {
namespace testing_generate_call {

inline constexpr auto kWait = std::chrono::seconds(10);

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
  // Waits until `n` requests reached the client.
  bool WaitForRequests(size_t n, std::chrono::milliseconds wait = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, wait, [&] { return requests_.size() >= n; });
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

inline bool IsValidUtf8(const std::string& s) {
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
        Tokenizer::FromModelDir(tandem::TestSourceDir() + "/tests/data/tokenizers/gpt2");
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

}  // namespace testing_generate_call
}  // namespace tandem
