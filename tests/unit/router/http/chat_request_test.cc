// Chat requests as the model's template and its parsers see them: key order kept from
// the request to the template and from the output to the response, add_generation_prompt and
// continue_final_message, where the reasoning starts (the template's thinking switch), output
// constraints on the answer only, the JSON size bounds of an order-keeping parse, and the
// responder's messages and stream chunks (reasoning_content, tool_calls deltas, token ids).

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "router/http/openai_request.h"
#include "router/http/openai_response.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& relative) {
  std::ifstream in(tandem::TestSourceDir() + "/" + relative, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ChatRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ =
        std::move(Tokenizer::FromModelDir(tandem::TestSourceDir() + "/models/stories260k")).value();
    Use("Qwen-Qwen3-0.6B");
  }
  // Serves an upstream template with the parsers its source implies.
  void Use(const std::string& name) {
    const std::string source = ReadFile("tests/data/chat_templates/upstream/" + name + ".jinja");
    template_ = std::move(ChatTemplate::Parse(source)).value();
    context_.tokenizer = tokenizer_.get();
    context_.chat_template = template_.get();
    context_.max_model_len = 4096;
    context_.tool_parser = ToolCallParserOfTemplate(source);
    context_.reasoning_parser = ReasoningParserOfTemplate(source);
  }
  absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
    auto json = ParseJsonBody(body, context_.limits);
    if (!json.ok()) return json.status();
    return ConvertOpenAiRequest(OpenAiEndpoint::kChatCompletions, *json, context_);
  }
  std::string Prompt(const OpenAiRequest& r) {
    const auto& ids = r.generate.token_ids().ids();
    return *tokenizer_->Decode(std::vector<int32_t>(ids.begin(), ids.end()), false);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  OpenAiContext context_;
};

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather.", "parameters": {"type": "object", "properties":
    {"unit": {"type": "string"}, "city": {"type": "string"}}, "required": ["city"]}}}])";

TEST_F(ChatRequestTest, KeyOrderReachesTheTemplateAsSent) {
  // The template prints the tools and the call's arguments with tojson: in the client's order
  // ("type" before "function", "unit" before "city"), as Hugging Face renders them.
  ChatRenderOptions o;
  const Json tools = Json::parse(kTools);
  o.tools = &tools;
  const Json messages = Json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"unit\": \"c\", \"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "cold"}])");
  auto r = RenderChat(messages, context_, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->prompt.find(R"({"type": "function", "function": {"name": "get_weather", )"
                           R"("description": "Weather.", "parameters": {"type": "object", )"
                           R"("properties": {"unit": {"type": "string"}, "city")"),
            std::string::npos)
      << r->prompt;
  EXPECT_NE(
      r->prompt.find(R"({"name": "get_weather", "arguments": {"unit": "c", "city": "Oslo"}})"),
      std::string::npos)
      << r->prompt;
}

TEST_F(ChatRequestTest, KeyOrderSurvivesTheHttpBody) {
  // The same through a request body (as POST /tokenize renders it).
  auto body = ParseJsonBody(std::string(R"({"messages": [{"role": "user", "content": "Hi"}],
      "tools": )") + kTools + "}",
                            context_.limits);
  ASSERT_TRUE(body.ok());
  auto text = TokenizeRequestText(*body, context_);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->add_special_tokens) << "the template writes them";
  EXPECT_NE(text->text.find(R"({"type": "function", "function": {"name": "get_weather", )"
                            R"("description": "Weather.", "parameters": {"type": "object", )"
                            R"("properties": {"unit": {"type": "string"}, "city")"),
            std::string::npos)
      << text->text;
}

TEST_F(ChatRequestTest, GenerationPromptAndContinueFinalMessage) {
  auto with = Chat(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  auto without = Chat(R"({"messages": [{"role": "user", "content": "Hi"}],
                          "add_generation_prompt": false})");
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(Prompt(*with), Prompt(*without) + "<|im_start|>assistant\n");
  auto cont = Chat(R"({"messages": [{"role": "user", "content": "Count."},
      {"role": "assistant", "content": "One, two,"}], "continue_final_message": true,
      "add_generation_prompt": false})");
  ASSERT_TRUE(cont.ok()) << cont.status();
  const std::string p = Prompt(*cont);
  EXPECT_EQ(p.substr(p.size() - 9), "One, two,") << p;
  // continue_final_message alone turns the generation prompt off, as vLLM requires.
  auto implied = Chat(R"({"messages": [{"role": "user", "content": "Count."},
      {"role": "assistant", "content": "One, two,"}], "continue_final_message": true})");
  ASSERT_TRUE(implied.ok()) << implied.status();
  EXPECT_EQ(Prompt(*implied), p);
  for (const std::string bad :
       {R"({"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": true})",
        R"({"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": true,
               "add_generation_prompt": true})",
        R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": 1})"}) {
    auto r = Chat(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

TEST_F(ChatRequestTest, ReasoningFollowsTheTemplatesSwitch) {
  EXPECT_EQ(context_.reasoning_parser, ReasoningParser::kQwen3);
  EXPECT_EQ(context_.tool_parser, ToolCallParser::kHermes);
  auto on = Chat(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  auto off = Chat(R"({"messages": [{"role": "user", "content": "Hi"}],
                      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(on->chat.start, ReasoningStart::kMayOpen);
  EXPECT_EQ(off->chat.start, ReasoningStart::kAnswer);
  Use("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
  EXPECT_EQ(context_.reasoning_parser, ReasoningParser::kDeepSeekR1);
  auto r1 = Chat(R"({"messages": [{"role": "user", "content": "Hi"}],
                     "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->chat.start, ReasoningStart::kInReasoning);
  // The constraint waits for the end of the reasoning block.
  const v1::OutputConstraint& c = r1->generate.sampling().constraint();
  ASSERT_EQ(c.kind_case(), v1::OutputConstraint::kGrammar);
  EXPECT_NE(c.grammar().find("tandem-reasoning"), std::string::npos);
  context_.constrain_reasoning = true;
  auto whole = Chat(R"({"messages": [{"role": "user", "content": "Hi"}],
                        "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(whole->generate.sampling().constraint().json_object());
}

TEST_F(ChatRequestTest, AutoToolChoiceCanBeTurnedOff) {
  const std::string body =
      std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )") + kTools;
  EXPECT_TRUE(Chat(body + "}").ok());
  context_.auto_tool_choice = false;
  auto r = Chat(body + "}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("--enable-auto-tool-choice"), std::string::npos);
  EXPECT_TRUE(Chat(body + R"(, "tool_choice": "required"})").ok());
  EXPECT_TRUE(Chat(body + R"(, "tool_choice": "none"})").ok());
}

TEST_F(ChatRequestTest, OrderedParsingIsBounded) {
  std::string many = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": {";
  for (int i = 0; i < 5000; ++i) many += (i ? ", \"" : "\"") + std::to_string(i) + "\": 0";
  many += "}}";
  auto r = Chat(many);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("more than 4096 keys"), std::string::npos)
      << r.status();
  // Many objects of legal size whose key pairs add up past the bound.
  std::string wide = "{\"messages\": [";
  for (int m = 0; m < 20; ++m) {
    wide += m ? ", {" : "{";
    for (int i = 0; i < 1500; ++i) wide += "\"k" + std::to_string(i) + "\": 0, ";
    wide += "\"role\": \"user\", \"content\": \"x\"}";
  }
  wide += "]}";
  r = Chat(wide);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("too many keys"), std::string::npos)
      << r.status();
}

v1::GenerateResponse Tokens(int32_t index, const std::string& text, std::vector<int32_t> ids) {
  v1::GenerateResponse m;
  m.mutable_chunk()->set_index(index);
  m.mutable_chunk()->set_text(text);
  for (int32_t id : ids) m.mutable_chunk()->add_token_ids(id);
  return m;
}

v1::GenerateResponse Final(int32_t index) {
  v1::GenerateResponse m;
  m.mutable_final()->set_index(index);
  m.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP);
  m.mutable_final()->mutable_usage()->set_prompt_tokens(3);
  m.mutable_final()->mutable_usage()->set_completion_tokens(4);
  return m;
}

TEST_F(ChatRequestTest, ResponderSeparatesReasoningAndStreamsCallsAsTheyForm) {
  auto req = Chat(std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )") +
                  kTools + R"(, "return_token_ids": true})");
  ASSERT_TRUE(req.ok()) << req.status();
  OpenAiResponderOptions o;
  o.endpoint = OpenAiEndpoint::kChatCompletions;
  o.id = "chatcmpl-x";
  o.chat = req->chat;
  o.return_token_ids = true;
  const std::vector<std::string> pieces = {"<think>\nNeed",
                                           " the weather.</th",
                                           "ink>\n\n<tool_",
                                           "call>\n{\"name\": \"get_weather\", ",
                                           "\"arguments\": {\"unit\": \"c\", ",
                                           "\"city\": \"Oslo\"}}\n</tool_call>"};
  v1::GenerateResponse first = Tokens(0, pieces[0], {1});
  first.add_prompt_token_ids(7);
  first.add_prompt_token_ids(8);

  // Not streamed.
  OpenAiResponder whole(o);
  whole.Accumulate(first);
  for (size_t i = 1; i < pieces.size(); ++i) whole.Accumulate(Tokens(0, pieces[i], {int32_t(i)}));
  whole.Accumulate(Final(0));
  const Json done = whole.Complete();
  const Json& msg = done["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nNeed the weather.");
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"unit": "c", "city": "Oslo"})");
  EXPECT_EQ(done["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(done["prompt_token_ids"], Json({7, 8}));
  EXPECT_EQ(done["choices"][0]["token_ids"], Json({1, 1, 2, 3, 4, 5}));
  EXPECT_EQ(done.begin().key(), "id") << "response keys in OpenAI's order";

  // Streamed: reasoning deltas, then the call's index, id and name, then argument fragments.
  OpenAiResponder stream(o);
  std::vector<Json> chunks;
  auto take = [&](const v1::GenerateResponse& m) {
    for (Json& c : stream.StreamChunks(m)) chunks.push_back(std::move(c));
  };
  take(first);
  for (size_t i = 1; i < pieces.size(); ++i) take(Tokens(0, pieces[i], {int32_t(i)}));
  take(Final(0));
  EXPECT_EQ(chunks.front()["prompt_token_ids"], Json({7, 8}));
  std::string reasoning, args;
  int announced = 0, fragments = 0;
  for (const Json& c : chunks) {
    const Json& d = c["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("content") && !d["content"].get<std::string>().empty()) << c.dump();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    for (const Json& tc : d["tool_calls"]) {
      if (tc.contains("id")) {
        ++announced;
        EXPECT_EQ(tc["function"]["name"], "get_weather");
        EXPECT_EQ(tc["id"], msg["tool_calls"][0]["id"]);
      } else {
        EXPECT_EQ(announced, 1) << "arguments after the name";
        args += tc["function"]["arguments"].get<std::string>();
        ++fragments;
      }
    }
  }
  EXPECT_EQ(reasoning, "\nNeed the weather.");
  EXPECT_EQ(announced, 1);
  EXPECT_GE(fragments, 2) << "arguments streamed as generated";
  EXPECT_EQ(args, msg["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(ChatRequestTest, MistralKeepsItsSpecialMarkersAndDropsTheEnd) {
  Use("mistralai-Mistral-Nemo-Instruct-2407");
  EXPECT_EQ(context_.tool_parser, ToolCallParser::kMistral);
  auto req = Chat(std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )") +
                  kTools + "}");
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_FALSE(req->generate.sampling().skip_special_tokens());
  EXPECT_TRUE(req->drop_eos_text);
  auto chosen = Chat(std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )") +
                     kTools + R"(, "skip_special_tokens": true})");
  ASSERT_TRUE(chosen.ok());
  EXPECT_TRUE(chosen->generate.sampling().skip_special_tokens()) << "the client's choice stays";
  OpenAiResponderOptions o;
  o.endpoint = OpenAiEndpoint::kChatCompletions;
  o.id = "chatcmpl-m";
  o.chat = req->chat;
  o.tokenizer = tokenizer_.get();
  o.drop_eos_text = true;
  OpenAiResponder r(o);
  const int32_t eos = *tokenizer_->eos_id();
  r.Accumulate(Tokens(0, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Nice\"}", {5, 6}));
  r.Accumulate(Tokens(0, std::string(tokenizer_->IdToToken(eos)), {eos}));
  r.Accumulate(Final(0));
  const Json done = r.Complete();
  const Json& msg = done["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << done.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city": "Nice"})");
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().size(), 9u) << "Mistral's id shape";
  EXPECT_TRUE(msg["content"].is_null()) << done.dump();
}

TEST_F(ChatRequestTest, MalformedCallsComeBackAsContent) {
  auto req = Chat(std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )") +
                  kTools + "}");
  ASSERT_TRUE(req.ok());
  OpenAiResponderOptions o;
  o.endpoint = OpenAiEndpoint::kChatCompletions;
  o.id = "chatcmpl-y";
  o.chat = req->chat;
  OpenAiResponder r(o);
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }";
  r.Accumulate(Tokens(0, text, {1}));
  r.Accumulate(Final(0));
  const Json done = r.Complete();
  EXPECT_EQ(done["choices"][0]["message"]["content"], text);
  EXPECT_FALSE(done["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(done["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace tandem
