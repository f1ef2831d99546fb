#include "router/http/openai_request.h"

#include <memory>
#include <string>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "router/http/openai_response.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

class OpenAiRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ =
        std::move(Tokenizer::FromModelDir(tandem::TestSourceDir() + "/models/stories260k")).value();
    template_ =
        std::move(ChatTemplate::Parse(BuiltinChatTemplateSource(BuiltinChatTemplate::kChatml)))
            .value();
    context_.tokenizer = tokenizer_.get();
    context_.chat_template = template_.get();
    context_.max_model_len = 512;
  }
  absl::StatusOr<OpenAiRequest> Convert(OpenAiEndpoint e, const std::string& body) {
    auto json = ParseJsonBody(body, context_.limits);
    if (!json.ok()) return json.status();
    return ConvertOpenAiRequest(e, *json, context_);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  OpenAiContext context_;
};

TEST_F(OpenAiRequestTest, MapsCompletionParameters) {
  auto r = Convert(OpenAiEndpoint::kCompletions,
                   R"({"prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                       "presence_penalty": 1, "frequency_penalty": -0.5, "seed": 42, "n": 3,
                       "stop": "x", "logprobs": 2, "user": "u", "stream": true,
                       "cache_salt": "mine",
                       "stream_options": {"include_usage": true}, "logit_bias": {"7": -100}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::SamplingParams& s = r->generate.sampling();
  EXPECT_EQ(r->generate.text(), "Hi");
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 1.0f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.5f);
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_EQ(r->generate.n(), 3);
  ASSERT_EQ(s.stop_size(), 1);
  EXPECT_EQ(s.stop(0), "x");
  EXPECT_EQ(s.logprobs(), 2);
  EXPECT_FLOAT_EQ(s.logit_bias().at(7), -100.0f);
  EXPECT_TRUE(r->stream && r->include_usage && r->logprobs);
  EXPECT_EQ(r->user, "u");
  // Passed on as the client's part of the salt; the Generation service adds the tenant.
  EXPECT_EQ(r->generate.cache_salt(), "mine");
}

TEST_F(OpenAiRequestTest, ChatRendersTheTemplateAndDefaultsMaxTokensToTheContext) {
  auto r = Convert(OpenAiEndpoint::kChatCompletions,
                   R"({"messages": [{"role": "user", "content": "Hello"}],
                       "max_tokens": 3, "max_completion_tokens": 9})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().max_tokens(), 9);  // max_completion_tokens wins
  auto want = tokenizer_->Encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
                                 /*add_special_tokens=*/false);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(std::vector<int32_t>(r->generate.token_ids().ids().begin(),
                                 r->generate.token_ids().ids().end()),
            *want);
  r = Convert(OpenAiEndpoint::kChatCompletions,
              R"({"messages": [{"role": "user", "content": "Hello"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().max_tokens(), 512 - static_cast<int32_t>(want->size()));
}

TEST_F(OpenAiRequestTest, RefusesBadBodiesNamingTheParameter) {
  struct Case {
    OpenAiEndpoint e;
    const char* body;
    const char* message;
  } cases[] = {
      {OpenAiEndpoint::kCompletions, "", "empty"},
      {OpenAiEndpoint::kCompletions, "{", "not valid JSON"},
      {OpenAiEndpoint::kCompletions, "3", "JSON object"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "temperature": "a"})", "temperature"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "top_p": 0})", "top_p"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "seed": 1e30})", "seed"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "stop": [1]})", "stop"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "stream_options": {}})", "stream_options"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "suffix": "y"})", "suffix"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "best_of": 2})", "best_of"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": {}})", "prompt"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": "x", "cache_salt": 3})", "cache_salt"},
      {OpenAiEndpoint::kCompletions, R"({"prompt": [1.5]})", "prompt"},
      {OpenAiEndpoint::kChatCompletions, R"({"messages": [1]})", "messages[0]"},
      {OpenAiEndpoint::kChatCompletions, R"({"messages": [{"role": "user", "content":
          [{"type": "image_url"}]}]})",
       "text parts"},
      {OpenAiEndpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json"}})",
       "response_format"},
  };
  for (const Case& c : cases) {
    auto r = Convert(c.e, c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(std::string(r.status().message()).find(c.message), std::string::npos)
        << c.body << " -> " << r.status();
  }
  std::string deep(200, '[');
  EXPECT_FALSE(ParseJsonBody("{\"a\": " + deep + "}", context_.limits).ok());
}

TEST(OpenAiResponseTest, ErrorShapesAndStatuses) {
  OpenAiError e = MakeOpenAiError(absl::StatusCode::kResourceExhausted, "slow down");
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.body["error"]["message"], "slow down");
  EXPECT_EQ(e.body["error"]["type"], "rate_limit_error");
  EXPECT_EQ(MakeOpenAiError(absl::StatusCode::kUnauthenticated, "").http_status, 401);
  EXPECT_EQ(MakeOpenAiError(absl::StatusCode::kInvalidArgument, "").http_status, 400);
  EXPECT_EQ(MakeOpenAiError(absl::StatusCode::kNotFound, "").http_status, 404);
  EXPECT_EQ(MakeOpenAiError(absl::StatusCode::kUnavailable, "").http_status, 503);
}

}  // namespace
}  // namespace tandem
