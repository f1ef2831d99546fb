// Tool calls in each model family's format: the HTTP layer reads the format from the chat
// template (Llama 3.1/3.2 JSON with "parameters", Qwen's Hermes <tool_call> blocks, Mistral's
// JSON array after [TOOL_CALLS] with 9-character ids); tool_choice "required" constrains the
// output to that format, and calls written the way each family's template renders them are
// parsed back into tool_calls.

#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "common/tokenizer/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/chat_output.h"
#include "router/http/openai_tools.h"
#include "router/http/tool_parsers.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Json ReadJson(const std::string& relative) {
  std::ifstream in(tandem::TestSourceDir() + "/" + relative, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

std::string Template(const std::string& name) {
  if (name == "qwen3") {
    return ReadJson("tests/data/tokenizers/qwen3/tokenizer_config.json")["chat_template"];
  }
  return ReadJson("tests/data/chat_templates/tool_templates.json")[name];
}

ToolCallOptions Tools(ToolCallFormat format, bool parallel) {
  ToolCallOptions o;
  o.choice = ToolCallOptions::Choice::kRequired;
  o.parallel = parallel;
  o.format = format;
  o.tools.push_back({"get_weather", Json::parse(R"({"type": "object", "properties":
      {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]})")});
  o.tools.push_back({"get_time", Json::parse(R"({"type": "object", "properties":
      {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]})")});
  return o;
}

// The calls `parser` reads from a complete output (nullopt: none, or malformed).
std::optional<std::vector<ToolCallPart>> Calls(ToolCallParser parser, const std::string& text) {
  const ToolCallParse p =
      ParseToolCallText(parser, text, /*final=*/true, {"get_weather", "get_time"});
  if (p.malformed || p.calls.empty()) return std::nullopt;
  return p.calls;
}

bool GrammarAccepts(const std::string& grammar, const std::string& text) {
  auto g = grammar::ParseGrammar(grammar);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << grammar;
  if (!g.ok()) return false;
  std::vector<std::string> bytes;
  for (int c = 1; c < 256; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  auto compiled = std::make_shared<grammar::CompiledGrammar>(std::move(*g),
                                                             grammar::TokenVocab::FromBytes(bytes));
  grammar::GrammarMatcher m(compiled);
  return m.AcceptBytes(text) && m.CanTerminate();
}

TEST(ToolCallFormatTest, FormatFollowsTheFamilysTemplate) {
  EXPECT_EQ(ToolCallParserOfTemplate(Template("llama-3.1")), ToolCallParser::kLlama3Json);
  EXPECT_EQ(ToolCallParserOfTemplate(Template("llama-3.2")), ToolCallParser::kLlama3Json);
  EXPECT_EQ(ToolCallParserOfTemplate(Template("qwen2.5")), ToolCallParser::kHermes);
  EXPECT_EQ(ToolCallParserOfTemplate(Template("qwen3")), ToolCallParser::kHermes);
  EXPECT_EQ(ToolCallParserOfTemplate(Template("mistral-v0.3")), ToolCallParser::kMistral);
  for (const std::string family : {"llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "mistral-v0.3"}) {
    EXPECT_EQ(ToolCallFormatOf(ToolCallParserOfTemplate(Template(family))),
              ToolCallFormatOfTemplate(Template(family)))
        << family;
  }
  EXPECT_EQ(ToolCallFormatOfTemplate(Template("llama-3.1")), ToolCallFormat::kLlama);
  EXPECT_EQ(ToolCallFormatOfTemplate(Template("llama-3.2")), ToolCallFormat::kLlama);
  EXPECT_EQ(ToolCallFormatOfTemplate(Template("qwen2.5")), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate(Template("qwen3")), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate(Template("mistral-v0.3")), ToolCallFormat::kJsonArray);
  EXPECT_TRUE(MistralCallIds(Template("mistral-v0.3")));
  EXPECT_FALSE(MistralCallIds(Template("qwen2.5")));
  for (auto b :
       {BuiltinChatTemplate::kLlama2, BuiltinChatTemplate::kLlama3, BuiltinChatTemplate::kChatml}) {
    EXPECT_EQ(ToolCallFormatOfTemplate(BuiltinChatTemplateSource(b)), ToolCallFormat::kJsonArray);
  }
}

TEST(ToolCallFormatTest, RequiredGrammarWritesEachFormatAndParsesBack) {
  struct Case {
    ToolCallFormat format;
    bool parallel;
    std::string text;  // compact, as the grammar writes it
    bool accepted;
    size_t calls;
  };
  const std::string weather = R"({"name":"get_weather","arguments":{"city":"Paris"}})";
  const std::string time = R"({"name":"get_time","arguments":{"tz":"CET"}})";
  const Case cases[] = {
      {ToolCallFormat::kJsonArray, true, "[" + weather + "," + time + "]", true, 2},
      {ToolCallFormat::kJsonArray, false, "[" + weather + "]", true, 1},
      {ToolCallFormat::kJsonArray, false, "[" + weather + "," + time + "]", false, 0},
      {ToolCallFormat::kHermes, true,
       "<tool_call>\n" + weather + "\n</tool_call>\n<tool_call>\n" + time + "\n</tool_call>", true,
       2},
      {ToolCallFormat::kHermes, false, "<tool_call>\n" + time + "\n</tool_call>", true, 1},
      {ToolCallFormat::kHermes, true, "[" + weather + "]", false, 0},
      {ToolCallFormat::kLlama, true, R"({"name":"get_weather","parameters":{"city":"Rome"}})", true,
       1},
      {ToolCallFormat::kLlama, true, weather, false, 0},
      {ToolCallFormat::kLlama, true, R"({"name":"get_time","parameters":{"tz":"PST"}})", false, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const ToolCallOptions tools = Tools(c.format, c.parallel);
    auto g = RequiredToolCallGrammar(tools);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(GrammarAccepts(*g, c.text), c.accepted);
    if (!c.accepted) continue;
    auto calls = Calls(RequiredOutputParser(c.format, ToolCallParser::kJson), c.text);
    ASSERT_TRUE(calls.has_value());
    ASSERT_EQ(calls->size(), c.calls);
    EXPECT_TRUE((*calls)[0].name == "get_weather" || (*calls)[0].name == "get_time");
    EXPECT_EQ(Json::parse((*calls)[0].arguments).size(), 1u);
  }
}

// Calls as each family's template renders them (tool_vectors.json), i.e. as the model was
// trained to write them, are recognised under tool_choice auto.
TEST(ToolCallFormatTest, ParsesCallsAsTheTemplatesRenderThem) {
  struct Output {
    ToolCallParser parser;
    std::string text;
    size_t calls;
  };
  const Output outputs[] = {
      // Llama 3.1/3.2 (and with the ipython tag).
      {ToolCallParser::kLlama3Json,
       R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}})", 1},
      {ToolCallParser::kLlama3Json,
       R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})", 1},
      // Qwen2.5 / Qwen3 Hermes blocks.
      {ToolCallParser::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": "
       "\"Europe/Paris\"}}\n</tool_call>",
       2},
      // Mistral v0.3, with its ids.
      {ToolCallParser::kMistral,
       R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call00001"}, {"name": "get_time", "arguments": {"tz": "UTC"}, "id": "call00002"}])",
       2},
  };
  for (const Output& o : outputs) {
    auto calls = Calls(o.parser, o.text);
    ASSERT_TRUE(calls.has_value()) << o.text;
    EXPECT_EQ(calls->size(), o.calls) << o.text;
    EXPECT_EQ((*calls)[0].name, "get_weather");
    EXPECT_EQ(Json::parse((*calls)[0].arguments)["city"], "Paris");
    EXPECT_FALSE(Calls(o.parser, "The weather is nice.").has_value());
    EXPECT_FALSE(Calls(o.parser, R"({"name": "unknown_tool", "arguments": {}})").has_value());
  }
}

// Mistral's template refuses call ids that are not 9 characters: the ids the server hands out
// for it render back.
TEST(ToolCallFormatTest, MistralIdsRenderBackThroughItsTemplate) {
  const std::vector<std::pair<std::string, std::string>> calls = {
      {"get_weather", R"({"city":"Paris"})"}, {"get_time", R"({"tz":"UTC"})"}};
  auto ids_json = [&](bool short_ids) {
    ChatOutputOptions o;
    o.id_base = "chatcmpl-42_0";
    o.short_ids = short_ids;
    Json out = Json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      out.push_back({{"id", ToolCallId(o, i, "")},
                     {"type", "function"},
                     {"function", {{"name", calls[i].first}, {"arguments", calls[i].second}}}});
    }
    return out;
  };
  const Json short_ids = ids_json(true);
  const Json long_ids = ids_json(false);
  ASSERT_EQ(short_ids.size(), 2u);
  EXPECT_NE(short_ids[0]["id"], short_ids[1]["id"]);
  auto t = ChatTemplate::Parse(Template("mistral-v0.3"));
  ASSERT_TRUE(t.ok());
  for (const Json* ids : {&short_ids, &long_ids}) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", "Weather?"}});
    nlohmann::ordered_json assistant = {{"role", "assistant"}, {"content", ""}};
    for (const Json& c : *ids) {
      const std::string id = c["id"];
      if (ids == &short_ids) {
        EXPECT_EQ(id.size(), 9u);
        for (char ch : id) EXPECT_TRUE(isalnum(static_cast<unsigned char>(ch))) << id;
      }
      assistant["tool_calls"].push_back(
          {{"id", id},
           {"type", "function"},
           {"function",
            {{"name", c["function"]["name"]},
             {"arguments",
              nlohmann::ordered_json::parse(c["function"]["arguments"].get<std::string>())}}}});
    }
    messages.push_back(assistant);
    auto out = (*t)->Render({{"messages", messages}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
    EXPECT_EQ(out.ok(), ids == &short_ids) << (out.ok() ? *out : out.status().ToString());
  }
}

}  // namespace
}  // namespace tandem
