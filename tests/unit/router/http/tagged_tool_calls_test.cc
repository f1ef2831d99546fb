// The tagged tool-call formats (Qwen3-Coder, GLM-4.5/4.6, MiniMax-M2, Kimi-K2) parsed back from
// what the families' published chat templates render for an assistant's call (the strings
// below are those templates' output, rendered by Python jinja2 and by Tandem alike), values typed
// by the tools' schemas, malformed calls as content, and streamed: the deltas add up to the
// message parsed whole.

#include "router/http/tagged_tool_calls.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/chat_output.h"
#include "router/http/tool_parsers.h"
#include "tests/unit/router/http/stream_check.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

const std::vector<std::string> kTools = {"get_weather", "add"};

Json Schemas() {
  return Json::parse(R"({
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer"}, "opts": {"type": "object"}}},
    "add": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": ["number",
        "null"]}, "flag": {"type": "boolean"}, "xs": {"type": "array"}}}})");
}

// The call each template renders for get_weather({"city": "Paris\nFrance", "days": 3,
// "opts": {"unit": "c", "x": [1, 2]}}).
const char kQwen3Coder[] =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\nFrance\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\", \"x\": [1, 2]}\n"
    "</parameter>\n</function>\n</tool_call>";
const char kGlm45[] =
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\nFrance</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>"
    "{\"unit\": \"c\", \"x\": [1, 2]}</arg_value>\n</tool_call>";
const char kMinimaxM2[] =
    "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris\nFrance"
    "</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"opts\">{\"unit\": "
    "\"c\", \"x\": [1, 2]}</parameter>\n</invoke>\n</minimax:tool_call>";
const char kKimiK2[] =
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"Paris\\nFrance\", \"days\": 3, \"opts\": {\"unit\": "
    "\"c\", \"x\": [1, 2]}}<|tool_call_end|><|tool_calls_section_end|>";

ToolCallParse ParseFinal(ToolCallParser parser, const std::string& text) {
  const Json schemas = Schemas();
  return ParseToolCallText(parser, text, /*final=*/true, kTools, &schemas);
}

TEST(TaggedToolCallsTest, ParsesWhatEachFamilysTemplateRenders) {
  const Json want = Json::parse(R"({"city": "Paris\nFrance", "days": 3,
                                   "opts": {"unit": "c", "x": [1, 2]}})");
  for (const auto& [parser, text] : std::vector<std::pair<ToolCallParser, std::string>>{
           {ToolCallParser::kQwen3Coder, kQwen3Coder},
           {ToolCallParser::kGlm45, kGlm45},
           {ToolCallParser::kMinimaxM2, kMinimaxM2},
           {ToolCallParser::kKimiK2, kKimiK2}}) {
    SCOPED_TRACE(ToolCallParserName(parser));
    const ToolCallParse p = ParseFinal(parser, "I will check.\n" + text + "\n");
    ASSERT_FALSE(p.malformed);
    EXPECT_EQ(p.content, "I will check.\n");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_TRUE(p.calls[0].complete);
    EXPECT_EQ(Json::parse(p.calls[0].arguments), want) << p.calls[0].arguments;
    EXPECT_EQ(p.calls[0].id, parser == ToolCallParser::kKimiK2 ? "functions.get_weather:0" : "");
  }
}

TEST(TaggedToolCallsTest, SeveralCallsAndKeyOrder) {
  const ToolCallParse q = ParseFinal(
      ToolCallParser::kQwen3Coder,
      "<tool_call>\n<function=add>\n<parameter=b>\n2\n</parameter>\n<parameter=a>\n1.5\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n<parameter=a>\n7\n"
      "</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(q.calls.size(), 2u);
  EXPECT_EQ(q.calls[0].arguments, R"({"b":2,"a":1.5})");
  EXPECT_EQ(q.calls[1].arguments, R"({"a":7})");
  const ToolCallParse m = ParseFinal(
      ToolCallParser::kMinimaxM2,
      "<minimax:tool_call>\n<invoke name=\"add\">\n<parameter name=\"a\">1</parameter>\n"
      "</invoke>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Rome</parameter>\n"
      "</invoke>\n</minimax:tool_call>");
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[1].arguments, R"({"city":"Rome"})");
  const ToolCallParse k = ParseFinal(
      ToolCallParser::kKimiK2,
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
      "{\"a\": 1}<|tool_call_end|><|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>"
      "{\"a\": 2}<|tool_call_end|><|tool_calls_section_end|>");
  ASSERT_EQ(k.calls.size(), 2u);
  EXPECT_EQ(k.calls[1].id, "functions.add:1");
  EXPECT_EQ(k.calls[1].arguments, R"({"a": 2})");  // Kimi's arguments are the model's JSON
  // Bytes that are not UTF-8 in a value become U+FFFD.
  const ToolCallParse bytes =
      ParseFinal(ToolCallParser::kGlm45,
                 "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>a\xff"
                 "</arg_value>\n</tool_call>");
  ASSERT_EQ(bytes.calls.size(), 1u);
  EXPECT_EQ(bytes.calls[0].arguments, "{\"city\":\"a\xef\xbf\xbd\"}");
  // Qwen3-Coder calls without the <tool_call> wrapper, and a missing closing tag at the end.
  const ToolCallParse bare =
      ParseFinal(ToolCallParser::kQwen3Coder, "<function=add>\n<parameter=a>\n1\n</parameter>\n");
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.calls[0].arguments, R"({"a":1})");
}

TEST(TaggedToolCallsTest, ValuesFollowTheSchemasTypes) {
  const Json s = Json::parse(R"({"str": {"type": "string"}, "int": {"type": "integer"},
      "num": {"type": "number"}, "bool": {"type": "boolean"}, "obj": {"type": "object"},
      "arr": {"type": "array"}, "opt": {"type": ["integer", "null"]}, "any": {}})");
  auto value = [&](const std::string& text, const char* key, bool glm = false) {
    return TypedArgumentValue(text, s.contains(key) ? &s[key] : nullptr, glm);
  };
  EXPECT_EQ(value("007", "str"), Json("007"));
  EXPECT_EQ(value("null", "str"), Json("null"));  // a string parameter keeps the text
  EXPECT_EQ(value("42", "int"), Json(42));
  EXPECT_EQ(value("1_000", "int"), Json(1000));
  EXPECT_EQ(value("4.5", "int"), Json("4.5"));  // not an integer: the text
  EXPECT_EQ(value("3.0", "num"), Json(3));
  EXPECT_EQ(value("2.5", "num"), Json(2.5));
  EXPECT_EQ(value("inf", "num"), Json("inf"));
  EXPECT_EQ(value("True", "bool"), Json(true));
  EXPECT_EQ(value("0", "bool"), Json(false));
  EXPECT_EQ(value("maybe", "bool"), Json("maybe"));
  EXPECT_EQ(value("{\"a\": [1]}", "obj"), Json::parse(R"({"a": [1]})"));
  EXPECT_EQ(value("{'a': True, 'b': None}", "obj"), Json::parse(R"({"a": true, "b": null})"));
  EXPECT_EQ(value("[1, 2", "arr"), Json("[1, 2"));  // not JSON nor a literal: the text
  EXPECT_EQ(value("NULL", "opt"), Json());
  EXPECT_EQ(value("5", "opt"), Json(5));
  EXPECT_EQ(value("5", "any"), Json("5"));  // no type: a string (Qwen3-Coder, MiniMax)
  EXPECT_EQ(value("5", "unknown"), Json("5"));
  EXPECT_EQ(value("5", "any", /*glm=*/true), Json(5));  // GLM reads untyped values as JSON
  EXPECT_EQ(value("[1, 'x']", "unknown", /*glm=*/true), Json::parse(R"([1, "x"])"));
}

TEST(TaggedToolCallsTest, MalformedCallsAreContent) {
  for (const auto& [parser, text] : std::vector<std::pair<ToolCallParser, std::string>>{
           {ToolCallParser::kQwen3Coder, "<tool_call>\n<function=nope>\n</function>\n</tool_call>"},
           {ToolCallParser::kGlm45, "<tool_call>nope\n</tool_call>"},
           {ToolCallParser::kMinimaxM2,
            "<minimax:tool_call>\n<invoke name=\"add\">\n<parameter name=\"a\">1"},
           {ToolCallParser::kKimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>get_weather<|tool_call_argument_begin|>"
            "{}<|tool_call_end|>"},  // no ":index"
           {ToolCallParser::kKimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0"
            "<|tool_call_argument_begin|>[1]<|tool_call_end|>"}}) {
    SCOPED_TRACE(text);
    const ToolCallParse p = ParseFinal(parser, text);
    EXPECT_TRUE(p.malformed);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, text);
  }
  // No call marker at all: plain content.
  const ToolCallParse plain = ParseFinal(ToolCallParser::kGlm45, "Just <b>an</b> answer.");
  EXPECT_FALSE(plain.malformed);
  EXPECT_EQ(plain.content, "Just <b>an</b> answer.");
}

TEST(TaggedToolCallsTest, ChosenFromTheTemplateAndByName) {
  EXPECT_EQ(ToolCallParserOfTemplate("{{ '<tool_call>\\n<function=' + name }}"),
            ToolCallParser::kQwen3Coder);
  EXPECT_EQ(ToolCallParserOfTemplate("<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>"),
            ToolCallParser::kGlm45);
  EXPECT_EQ(ToolCallParserOfTemplate("{%- set t = '<minimax:tool_call>' -%}"),
            ToolCallParser::kMinimaxM2);
  EXPECT_EQ(ToolCallParserOfTemplate("<|tool_calls_section_begin|>"), ToolCallParser::kKimiK2);
  for (const char* name : {"qwen3_coder", "glm45", "glm4_moe", "minimax_m2", "kimi_k2"}) {
    auto p = ToolCallParserByName(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ(*ToolCallParserByName(ToolCallParserName(*p)), *p);
  }
}

TEST(TaggedToolCallsTest, StreamedDeltasAddUpToTheWholeMessage) {
  ChatOutputOptions o;
  o.tools = true;
  o.tool_names = kTools;
  o.tool_parameters = Schemas();
  o.id_base = "x";
  for (const auto& [parser, text] : std::vector<std::pair<ToolCallParser, std::string>>{
           {ToolCallParser::kQwen3Coder, kQwen3Coder},
           {ToolCallParser::kGlm45, kGlm45},
           {ToolCallParser::kMinimaxM2, kMinimaxM2},
           {ToolCallParser::kKimiK2, kKimiK2}}) {
    o.parser = parser;
    ExpectStreamMatchesWhole(o, "Checking <the> weather.\n" + text);
    ExpectStreamMatchesWhole(o, text + text);
    ExpectStreamMatchesWhole(o, "No call here, just < and <tool text.");
  }
}

}  // namespace
}  // namespace tandem
