// vLLM's chat_template_kwargs on chat completions: its keys become chat template variables.
// Qwen3's template rendered with enable_thinking false and true equals the Jinja reference
// (tests/data/chat_templates/vectors.json, made by Python's jinja2 as transformers configures
// it); malformed values are a 400 naming the field.

#include <fstream>
#include <memory>
#include <string>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/chat_prompt.h"
#include "router/http/openai_request.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Json ReadJson(const std::string& path) {
  std::ifstream in(tandem::TestSourceDir() + "/" + path);
  return Json::parse(in);
}

class ChatTemplateKwargsTest : public testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ =
        std::move(Tokenizer::FromModelDir(tandem::TestSourceDir() + "/models/stories260k")).value();
    const Json config = ReadJson("tests/data/tokenizers/qwen3/tokenizer_config.json");
    template_ = std::move(ChatTemplate::Parse(config["chat_template"].get<std::string>())).value();
    context_.tokenizer = tokenizer_.get();
    context_.chat_template = template_.get();
    context_.max_model_len = 4096;
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

TEST_F(ChatTemplateKwargsTest, Qwen3EnableThinkingEqualsTheJinjaReference) {
  const Json vectors = ReadJson("tests/data/chat_templates/vectors.json");
  int checked = 0;
  for (const auto& c : vectors["cases"]) {
    const std::string name = c["name"];
    if (name.rfind("tokenizer:qwen3/", 0) != 0 ||
        name.find("enable_thinking=") == std::string::npos)
      continue;
    const Json& vars = c["variables"];
    Json kwargs = {{"enable_thinking", vars["enable_thinking"]}};
    auto text = RenderChatPrompt(vars["messages"], context_, nullptr, &kwargs);
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    EXPECT_EQ(*text, c["expected"].get<std::string>()) << name;
    ++checked;
  }
  EXPECT_GE(checked, 4);
  // The switch changes the prompt: false closes an empty think block.
  const Json messages = {{{"role", "user"}, {"content", "Hi"}}};
  Json off = {{"enable_thinking", false}}, on = {{"enable_thinking", true}};
  auto a = RenderChatPrompt(messages, context_, nullptr, &off);
  auto b = RenderChatPrompt(messages, context_, nullptr, &on);
  auto none = RenderChatPrompt(messages, context_);
  ASSERT_TRUE(a.ok() && b.ok() && none.ok());
  EXPECT_NE(a->find("<think>\n\n</think>"), std::string::npos) << *a;
  EXPECT_EQ(b->find("<think>"), std::string::npos) << *b;
  EXPECT_EQ(*b, *none);
}

TEST_F(ChatTemplateKwargsTest, ForwardedThroughTheChatRequest) {
  auto off = Convert(OpenAiEndpoint::kChatCompletions,
                     R"({"messages": [{"role": "user", "content": "Hi"}],
                         "chat_template_kwargs": {"enable_thinking": false}})");
  auto on = Convert(OpenAiEndpoint::kChatCompletions,
                    R"({"messages": [{"role": "user", "content": "Hi"}],
                        "chat_template_kwargs": {"enable_thinking": true}})");
  ASSERT_TRUE(off.ok()) << off.status();
  ASSERT_TRUE(on.ok()) << on.status();
  // The closed think block adds tokens to the prompt.
  EXPECT_GT(off->generate.token_ids().ids_size(), on->generate.token_ids().ids_size());
}

TEST_F(ChatTemplateKwargsTest, RefusesMalformedKwargs) {
  struct Case {
    OpenAiEndpoint e;
    std::string kwargs;
    std::string message;
  };
  std::string many = "{";
  for (int i = 0; i < 65; ++i) many += (i ? ", \"k" : "\"k") + std::to_string(i) + "\": 1";
  many += "}";
  const std::string big = "{\"x\": \"" + std::string(70000, 'a') + "\"}";
  const Case cases[] = {
      {OpenAiEndpoint::kChatCompletions, "[1, 2]", "must be an object"},
      {OpenAiEndpoint::kChatCompletions, "\"enable_thinking\"", "must be an object"},
      {OpenAiEndpoint::kChatCompletions, "true", "must be an object"},
      {OpenAiEndpoint::kChatCompletions, many, "at most 64 keys"},
      {OpenAiEndpoint::kChatCompletions, big, "bytes"},
      {OpenAiEndpoint::kChatCompletions, R"({"messages": []})", "chat_template_kwargs.messages"},
      {OpenAiEndpoint::kChatCompletions, R"({"add_generation_prompt": false})",
       "chat_template_kwargs.add_generation_prompt"},
      {OpenAiEndpoint::kCompletions, R"({"enable_thinking": false})", "chat completions"},
  };
  for (const Case& c : cases) {
    const std::string body =
        c.e == OpenAiEndpoint::kCompletions
            ? R"({"prompt": "x", "chat_template_kwargs": )" + c.kwargs + "}"
            : R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": )" +
                  c.kwargs + "}";
    auto r = Convert(c.e, body);
    ASSERT_FALSE(r.ok()) << c.kwargs.substr(0, 80);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find("chat_template_kwargs"), std::string::npos)
        << r.status();
    EXPECT_NE(std::string(r.status().message()).find(c.message), std::string::npos) << r.status();
  }
  // null means absent.
  EXPECT_TRUE(Convert(OpenAiEndpoint::kChatCompletions,
                      R"({"messages": [{"role": "user", "content": "x"}],
                          "chat_template_kwargs": null})")
                  .ok());
}

}  // namespace
}  // namespace tandem
