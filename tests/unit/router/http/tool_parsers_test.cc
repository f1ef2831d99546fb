// Each family's tool-call format parsed into calls (text before the calls, several calls, key
// order kept, malformed calls as content), and streamed: every prefix of an output parses into
// a prefix of the final calls, so the deltas ChatOutput sends add up to the non-streamed message.

#include "router/http/tool_parsers.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "router/http/chat_output.h"
#include "tests/unit/router/http/stream_check.h"

namespace tandem {
namespace {

const std::vector<std::string> kTools = {"get_weather", "add"};

struct Want {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool malformed = false;
};

void ExpectParse(ToolCallParser parser, const std::string& text, const Want& want) {
  SCOPED_TRACE(std::string(ToolCallParserName(parser)) + ": " + text);
  const ToolCallParse p = ParseToolCallText(parser, text, /*final=*/true, kTools);
  EXPECT_EQ(p.malformed, want.malformed);
  EXPECT_EQ(p.content + p.trailing, want.content);
  ASSERT_EQ(p.calls.size(), want.calls.size());
  for (size_t i = 0; i < p.calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, want.calls[i].first);
    EXPECT_EQ(p.calls[i].arguments, want.calls[i].second);
    EXPECT_TRUE(p.calls[i].complete);
  }
}

TEST(ToolParsersTest, Hermes) {
  const auto h = ToolCallParser::kHermes;
  ExpectParse(h,
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", "
              "\"city\": \"Paris\"}}\n</tool_call>",
              {"", {{"get_weather", R"({"unit": "c", "city": "Paris"})"}}});
  ExpectParse(
      h,
      "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Rome\"}}\n</tool_call>",
      {"Let me check.\n", {{"add", R"({"a": 1})"}, {"get_weather", R"({"city": "Rome"})"}}});
  // The closing tag cut by the end of the output still ends the call.
  ExpectParse(h, "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}", {"", {{"add", "{}"}}});
  // Arguments given as a string holding JSON.
  ExpectParse(h, "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 2}\"}</tool_call>",
              {"", {{"add", R"({"a": 2})"}}});
  for (const std::string bad : {
           "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": }}\n</tool_call>",
           "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1",
           "<tool_call>\nnot json\n</tool_call>",
       }) {
    ExpectParse(h, bad, {bad, {}, true});
  }
  ExpectParse(h, "Just text, no call.", {"Just text, no call.", {}});
}

TEST(ToolParsersTest, Llama3JsonAndPythonic) {
  const auto l = ToolCallParser::kLlama3Json;
  ExpectParse(l, R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
              {"", {{"get_weather", R"({"city": "Paris"})"}}});
  ExpectParse(l, "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"b\": 2, \"a\": 1}}",
              {"", {{"add", R"({"b": 2, "a": 1})"}}});
  ExpectParse(
      l,
      R"({"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {"city": "Oslo"}})",
      {"", {{"add", R"({"a": 1})"}, {"get_weather", R"({"city": "Oslo"})"}}});
  ExpectParse(l, R"([get_weather(city="Paris"), add(a=1, b=2)])",
              {"", {{"get_weather", R"({"city":"Paris"})"}, {"add", R"({"a":1,"b":2})"}}});
  ExpectParse(l, "The weather is fine.", {"The weather is fine.", {}});
  ExpectParse(l, "[1, 2, 3]", {"[1, 2, 3]", {}});
  const std::string unknown = R"({"name": "nope", "parameters": {}})";
  ExpectParse(l, unknown, {unknown, {}, true});
}

TEST(ToolParsersTest, PythonicLiterals) {
  const auto p = ToolCallParser::kPythonic;
  ExpectParse(
      p,
      "[get_weather(city='Saint-\\'Denis', days=[1, 2.5, -3], opts={'x': True, 'y': "
      "None}, note=\"a\\nb\")]",
      {"",
       {{"get_weather",
         R"({"city":"Saint-'Denis","days":[1,2.5,-3],"opts":{"x":true,"y":null},"note":"a\nb"})"}}});
  ExpectParse(p, "<|python_start|>[add(a=1)]<|python_end|>", {"", {{"add", R"({"a":1})"}}});
  ExpectParse(p, "[add()]", {"", {{"add", "{}"}}});
  const std::string bad = "[add(a=)]";
  ExpectParse(p, bad, {bad, {}, true});
  EXPECT_EQ(PythonLiteralToJson("(1, 'two', [3.])"), R"([1,"two",[3.0]])");
  EXPECT_EQ(PythonLiteralToJson("{'k': \"\\u00e9\"}"), "{\"k\":\"\xc3\xa9\"}");
  EXPECT_FALSE(PythonLiteralToJson("os.system('x')").has_value());
}

TEST(ToolParsersTest, Mistral) {
  const auto m = ToolCallParser::kMistral;
  ExpectParse(
      m,
      R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Lyon"}}])",
      {"", {{"add", R"({"a": 1})"}, {"get_weather", R"({"city": "Lyon"})"}}});
  // Decoded without special tokens the marker is gone: the array alone.
  ExpectParse(m, R"([{"name": "add", "arguments": {"a": 1}}])", {"", {{"add", R"({"a": 1})"}}});
  ExpectParse(
      m,
      R"([TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Nice"})",
      {"", {{"add", R"({"a": 1})"}, {"get_weather", R"({"city": "Nice"})"}}});
  const ToolCallParse p = ParseToolCallText(
      m, R"(Sure. [TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{"a": 1})", true, kTools);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].id, "abcDEF123");
  EXPECT_EQ(p.content, "Sure. ");
}

TEST(ToolParsersTest, Phi4MiniDeepSeekAndJson) {
  ExpectParse(ToolCallParser::kPhi4MiniJson,
              R"(I will add. functools[{"name": "add", "arguments": {"a": 1, "b": 2}}])",
              {"I will add. ", {{"add", R"({"a": 1, "b": 2})"}}});
  ExpectParse(
      ToolCallParser::kDeepSeekV3,
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>add\n```json\n{\"a\": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"Checking.", {{"get_weather", R"({"city": "Paris"})"}, {"add", R"({"a": 3})"}}});
  ExpectParse(ToolCallParser::kDeepSeekV3,
              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 4}"
              "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
              {"", {{"add", R"({"a": 4})"}}});
  const auto j = ToolCallParser::kJson;
  ExpectParse(j, R"({"name": "add", "arguments": {"a": 1}})", {"", {{"add", R"({"a": 1})"}}});
  ExpectParse(j, R"([{"name": "add", "arguments": {"a": 1}}])", {"", {{"add", R"({"a": 1})"}}});
  ExpectParse(j, "Calling it.\n```json\n{\"name\": \"add\", \"arguments\": {\"a\": 5}}\n```",
              {"Calling it.\n", {{"add", R"({"a": 5})"}}});
  ExpectParse(j, R"({"answer": 42})", {R"({"answer": 42})", {}});
}

TEST(ToolParsersTest, ChosenFromTheTemplateAndByName) {
  EXPECT_EQ(ToolCallParserOfTemplate("{{'<tool_call>'}}"), ToolCallParser::kHermes);
  EXPECT_EQ(ToolCallParserOfTemplate("[TOOL_CALLS]"), ToolCallParser::kMistral);
  EXPECT_EQ(ToolCallParserOfTemplate("<|start_header_id|> <|python_tag|>"),
            ToolCallParser::kLlama3Json);
  EXPECT_EQ(ToolCallParserOfTemplate("<｜tool▁call▁begin｜>"), ToolCallParser::kDeepSeekV3);
  EXPECT_EQ(ToolCallParserOfTemplate("chatml"), ToolCallParser::kJson);
  for (const char* name : {"hermes", "llama3_json", "pythonic", "mistral", "phi4_mini_json",
                           "deepseek_v3", "deepseek_v31", "llama4_pythonic", "json"}) {
    EXPECT_TRUE(ToolCallParserByName(name).ok()) << name;
  }
  EXPECT_FALSE(ToolCallParserByName("granite").ok());
}

// Streams `text` one character at a time and checks that the deltas add up to Whole().
void ExpectStreamMatchesWhole(ToolCallParser parser, const std::string& text) {
  ChatOutputOptions o;
  o.tools = true;
  o.parser = parser;
  o.tool_names = kTools;
  o.id_base = "x";
  ExpectStreamMatchesWhole(o, text);
}

TEST(ToolParsersTest, StreamedDeltasAddUpToTheWholeMessage) {
  ExpectStreamMatchesWhole(ToolCallParser::kHermes,
                           "Let me see.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": "
                           "[1, {\"x\": \"}\"}]}}\n</tool_call>\n<tool_call>\n{\"arguments\": "
                           "{\"city\": \"Paris\"}, \"name\": \"get_weather\"}\n</tool_call>");
  ExpectStreamMatchesWhole(ToolCallParser::kHermes, "No <tool_ here, < just text.");
  ExpectStreamMatchesWhole(
      ToolCallParser::kLlama3Json,
      R"({"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"a": 2}})");
  ExpectStreamMatchesWhole(ToolCallParser::kLlama3Json, R"([get_weather(city="Paris"), add(a=1)])");
  ExpectStreamMatchesWhole(
      ToolCallParser::kMistral,
      R"([TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[ARGS]{"city": "x"})");
  ExpectStreamMatchesWhole(ToolCallParser::kMistral,
                           R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}])");
  ExpectStreamMatchesWhole(ToolCallParser::kPhi4MiniJson,
                           R"(ok functools[{"name": "add", "arguments": {"a": 1}}])");
  ExpectStreamMatchesWhole(ToolCallParser::kDeepSeekV3,
                           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n"
                           "```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ExpectStreamMatchesWhole(ToolCallParser::kJson, "text\n```json\n{\"name\": \"add\"}\n```");
  ExpectStreamMatchesWhole(ToolCallParser::kJson, R"({"plain": "json"})");
  // A malformed call that never announced a call: all content, streamed or not.
  ExpectStreamMatchesWhole(ToolCallParser::kHermes, "<tool_call>\n{\"name\": \"nope\"}");
}

}  // namespace
}  // namespace tandem
