#include "router/http/openai_tools.h"

#include <memory>
#include <string>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

const Json kTools = Json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}}},
  {"type":"function","function":{"name":"add","parameters":{"type":"object",
    "properties":{"a":{"type":"integer"},"b":{"$ref":"#/$defs/n"}},"required":["a","b"],
    "$defs":{"n":{"type":"integer","minimum":0}}}}}])");

bool GrammarMatches(const std::string& grammar, const std::string& text) {
  auto g = grammar::ParseGrammar(grammar);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << grammar;
  if (!g.ok()) return false;
  grammar::GrammarMatcher m(std::make_shared<grammar::CompiledGrammar>(
      std::move(*g), grammar::TokenVocab::FromBytes({"a"})));
  return m.AcceptBytes(text) && m.CanTerminate();
}

TEST(OpenAiToolsTest, ToolChoiceModes) {
  Json body = {{"tools", kTools}};
  auto t = ParseToolOptions(body);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->choice, ToolCallOptions::Choice::kAuto);
  body["tool_choice"] = "required";
  EXPECT_EQ(ParseToolOptions(body)->choice, ToolCallOptions::Choice::kRequired);
  body["tool_choice"] = "none";
  EXPECT_EQ(ParseToolOptions(body)->choice, ToolCallOptions::Choice::kNone);
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "add"}}}};
  t = ParseToolOptions(body);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->choice, ToolCallOptions::Choice::kNamed);
  EXPECT_EQ(t->named, "add");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  EXPECT_FALSE(ParseToolOptions(body).ok());
  body["tool_choice"] = "sometimes";
  EXPECT_FALSE(ParseToolOptions(body).ok());
  EXPECT_FALSE(ParseToolOptions({{"tool_choice", "required"}}).ok());  // no tools
  EXPECT_FALSE(ParseToolOptions({{"tools", {{{"type", "code"}}}}}).ok());
}

TEST(OpenAiToolsTest, RequiredGrammarMatchesCallsOfEveryTool) {
  auto t = ParseToolOptions({{"tools", kTools}, {"tool_choice", "required"}});
  ASSERT_TRUE(t.ok());
  auto g = RequiredToolCallGrammar(*t);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(GrammarMatches(*g, R"([{"name":"add","arguments":{"a":-1,"b":2}}])"));
  EXPECT_TRUE(GrammarMatches(
      *g,
      R"([{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"add","arguments":{"a":1,"b":0}}])"));
  EXPECT_FALSE(GrammarMatches(*g, R"([{"name":"add","arguments":{"a":1,"b":-2}}])"));
  EXPECT_FALSE(GrammarMatches(*g, R"([{"name":"sub","arguments":{}}])"));
  EXPECT_FALSE(GrammarMatches(*g, "[]"));
  t->parallel = false;
  g = RequiredToolCallGrammar(*t);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(GrammarMatches(
      *g,
      R"([{"name":"add","arguments":{"a":1,"b":0}},{"name":"add","arguments":{"a":1,"b":0}}])"));
}

TEST(OpenAiToolsTest, ConstraintFieldsAndConflicts) {
  ToolCallOptions none;
  v1::OutputConstraint c;
  ASSERT_TRUE(
      ConvertOutputConstraint({{"response_format", {{"type", "json_object"}}}}, none, &c).ok());
  EXPECT_TRUE(c.json_object());
  c.Clear();
  Json rf = {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", {{"type", "object"}}}}}};
  ASSERT_TRUE(ConvertOutputConstraint({{"response_format", rf}}, none, &c).ok());
  EXPECT_EQ(Json::parse(c.json_schema()), Json({{"type", "object"}}));
  EXPECT_TRUE(c.strict());
  c.Clear();
  ASSERT_TRUE(ConvertOutputConstraint({{"guided_choice", {"a", "b"}}}, none, &c).ok());
  EXPECT_EQ(c.choice().choices_size(), 2);
  c.Clear();
  auto st = ConvertOutputConstraint({{"guided_regex", "a"}, {"guided_json", {{"type", "string"}}}},
                                    none, &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  c.Clear();
  EXPECT_FALSE(ConvertOutputConstraint({{"response_format", {{"type", "xml"}}}}, none, &c).ok());
  auto named =
      ParseToolOptions({{"tools", kTools},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}}});
  ASSERT_TRUE(named.ok());
  c.Clear();
  ASSERT_TRUE(ConvertOutputConstraint(Json::object(), *named, &c).ok());
  EXPECT_EQ(Json::parse(c.json_schema())["required"], Json({"a", "b"}));
}

TEST(OpenAiToolsTest, RequiredOutputIsReadBackByTheParserOfItsFormat) {
  EXPECT_EQ(ToolCallFormatOf(ToolCallParser::kHermes), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf(ToolCallParser::kLlama3Json), ToolCallFormat::kLlama);
  EXPECT_EQ(ToolCallFormatOf(ToolCallParser::kPhi4MiniJson), ToolCallFormat::kJsonArray);
  // Phi-4-mini's and DeepSeek's required output is the generic JSON array.
  EXPECT_EQ(RequiredOutputParser(ToolCallFormat::kJsonArray, ToolCallParser::kPhi4MiniJson),
            ToolCallParser::kJson);
  EXPECT_EQ(RequiredOutputParser(ToolCallFormat::kJsonArray, ToolCallParser::kMistral),
            ToolCallParser::kMistral);
  const ToolCallParse p = ParseToolCallText(
      RequiredOutputParser(ToolCallFormat::kJsonArray, ToolCallParser::kDeepSeekV3),
      R"([{"name":"add","arguments":{"b":2,"a":1}}])", true, {"add", "get_weather"});
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"b":2,"a":1})") << "key order as generated";
}

}  // namespace
}  // namespace tandem
