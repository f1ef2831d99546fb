// Reasoning separated from the answer: where an output starts (from the prompt the template
// rendered), tags split across streamed pieces, tool calls and constraints on the answer only.

#include "router/http/reasoning_parser.h"

#include <memory>
#include <string>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"
#include "router/http/answer_constraint.h"
#include "router/http/chat_output.h"

namespace tandem {
namespace {

std::pair<std::string, std::string> Split(ReasoningParser p, ReasoningStart start,
                                          const std::string& text, size_t piece) {
  ReasoningSplitter s(p, start);
  std::string reasoning, answer;
  for (size_t i = 0; i < text.size(); i += piece)
    s.Feed(text.substr(i, piece), &reasoning, &answer);
  s.Finish(&reasoning, &answer);
  return {reasoning, answer};
}

TEST(ReasoningParserTest, StartFollowsThePrompt) {
  const auto q = ReasoningParser::kQwen3;
  EXPECT_EQ(ReasoningStartOf(q, "<|im_start|>assistant\n"), ReasoningStart::kMayOpen);
  EXPECT_EQ(ReasoningStartOf(q, "<|im_start|>assistant\n<think>\n"), ReasoningStart::kInReasoning);
  // Qwen3 with enable_thinking false: the template closes an empty block.
  EXPECT_EQ(ReasoningStartOf(q, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            ReasoningStart::kAnswer);
  // DeepSeek-R1 models may skip the open tag: the output is reasoning until the close tag.
  EXPECT_EQ(ReasoningStartOf(ReasoningParser::kDeepSeekR1, "<｜Assistant｜>"),
            ReasoningStart::kInReasoning);
  EXPECT_EQ(ReasoningStartOf(ReasoningParser::kDeepSeekR1, "<｜Assistant｜></think>"),
            ReasoningStart::kAnswer);
  // continue_final_message inside an open block.
  EXPECT_EQ(ReasoningStartOf(q, "...<think>\nSo far", "<think>\nSo far"),
            ReasoningStart::kInReasoning);
  EXPECT_EQ(ReasoningStartOf(ReasoningParser::kNone, "<think>"), ReasoningStart::kAnswer);
  EXPECT_EQ(ReasoningParserOfTemplate("{{ '<think>\\n' }}"), ReasoningParser::kQwen3);
  EXPECT_EQ(ReasoningParserOfTemplate("<｜Assistant｜><think>"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(ReasoningParserOfTemplate("<|im_start|>"), ReasoningParser::kNone);
}

TEST(ReasoningParserTest, SplitsAtTheTagsWhateverThePieces) {
  for (size_t piece : {1, 2, 3, 7, 100}) {
    SCOPED_TRACE(piece);
    auto [r, a] = Split(ReasoningParser::kQwen3, ReasoningStart::kMayOpen,
                        "<think>\nThe user wants x < y.</th</think>\n\nHello </think>", piece);
    EXPECT_EQ(r, "\nThe user wants x < y.</th");
    EXPECT_EQ(a, "Hello </think>");
    std::tie(r, a) =
        Split(ReasoningParser::kQwen3, ReasoningStart::kMayOpen, "  Hi <think>", piece);
    EXPECT_EQ(r, "");
    EXPECT_EQ(a, "  Hi <think>");
    std::tie(r, a) = Split(ReasoningParser::kDeepSeekR1, ReasoningStart::kInReasoning,
                           "Okay, so.\n</think>\n\nAnswer.", piece);
    EXPECT_EQ(r, "Okay, so.\n");
    EXPECT_EQ(a, "Answer.");
    // Cut off inside the reasoning: all of it is reasoning.
    std::tie(r, a) =
        Split(ReasoningParser::kQwen3, ReasoningStart::kInReasoning, "Still </thi", piece);
    EXPECT_EQ(r, "Still </thi");
    EXPECT_EQ(a, "");
  }
}

TEST(ReasoningParserTest, ToolCallsAfterTheReasoningBlock) {
  ChatOutputOptions o;
  o.reasoning = ReasoningParser::kQwen3;
  o.start = ReasoningStart::kMayOpen;
  o.tools = true;
  o.parser = ToolCallParser::kHermes;
  o.tool_names = {"get_weather"};
  o.id_base = "c";
  const std::string text =
      "<think>\nI should call <tool_call> get_weather.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ChatMessage m = ChatOutput::Whole(o, text);
  EXPECT_EQ(m.reasoning, "\nI should call <tool_call> get_weather.\n");
  EXPECT_FALSE(m.content.has_value());
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(m.calls[0].arguments, R"({"city": "Paris"})");
  // Streamed: reasoning deltas first, then the call (never content).
  ChatOutput out(o);
  std::string reasoning, content, args;
  for (char c : text) {
    const ChatDelta d = out.Feed(std::string(1, c));
    reasoning += d.reasoning;
    content += d.content;
    for (const auto& call : d.calls) args += call.arguments;
  }
  const ChatDelta last = out.Finish();
  content += last.content;
  EXPECT_EQ(reasoning, *m.reasoning);
  EXPECT_EQ(content, "");
  EXPECT_EQ(args, m.calls[0].arguments);
  EXPECT_TRUE(out.streamed_calls());
}

bool Matches(const std::string& grammar, const std::string& text) {
  auto g = grammar::ParseGrammar(grammar);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << grammar;
  if (!g.ok()) return false;
  grammar::GrammarMatcher m(std::make_shared<grammar::CompiledGrammar>(
      std::move(*g), grammar::TokenVocab::FromBytes({"a"})));
  return m.AcceptBytes(text) && m.CanTerminate();
}

TEST(ReasoningParserTest, TextUntilTheCloseTag) {
  auto rules = TextUntilTagGrammar("body", "</think>");
  ASSERT_TRUE(rules.ok()) << rules.status();
  const std::string g = "root ::= body\n" + *rules;
  for (const std::string ok : {"</think>", "abc</think>", "<</think>", "</thin</think>",
                               "a </th <x> </thinkk </think>", "<<</think>", "</think</think>"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const std::string bad : {"", "abc", "</think>x", "a</think></think>", "</thinK>"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(ReasoningParserTest, ConstraintsApplyToTheAnswerOnly) {
  v1::OutputConstraint c;
  c.set_json_schema(
      R"({"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["z", "a"]})");
  ASSERT_TRUE(ConstrainAnswerOnly(ReasoningParser::kQwen3, ReasoningStart::kMayOpen, &c).ok());
  ASSERT_EQ(c.kind_case(), v1::OutputConstraint::kGrammar);
  EXPECT_TRUE(Matches(c.grammar(), R"({"z":1,"a":2})"));
  EXPECT_TRUE(Matches(c.grammar(), "<think>\nHmm {not json}.\n</think>\n\n{\"z\":1,\"a\":2}"));
  EXPECT_FALSE(Matches(c.grammar(), "<think>x</think>{\"a\":2,\"z\":1}"));
  EXPECT_FALSE(Matches(c.grammar(), "Hmm {\"z\":1,\"a\":2}"));

  v1::OutputConstraint r;
  r.set_regex("(yes|no)");
  ASSERT_TRUE(
      ConstrainAnswerOnly(ReasoningParser::kDeepSeekR1, ReasoningStart::kInReasoning, &r).ok());
  EXPECT_TRUE(Matches(r.grammar(), "thinking...</think>\n\nyes"));
  EXPECT_FALSE(Matches(r.grammar(), "yes"));

  v1::OutputConstraint u;
  u.set_grammar("root ::= item+ # items\nitem ::= [a-c]{1,2} \"!\"\n");
  ASSERT_TRUE(ConstrainAnswerOnly(ReasoningParser::kQwen3, ReasoningStart::kInReasoning, &u).ok());
  EXPECT_TRUE(Matches(u.grammar(), "</think>ab!c!"));
  EXPECT_FALSE(Matches(u.grammar(), "</think>abc!"));

  v1::OutputConstraint choice;
  choice.mutable_choice()->add_choices("A");
  ASSERT_TRUE(ConstrainAnswerOnly(ReasoningParser::kQwen3, ReasoningStart::kAnswer, &choice).ok());
  EXPECT_EQ(choice.kind_case(), v1::OutputConstraint::kChoice) << "no reasoning: unchanged";

  v1::OutputConstraint bad;
  bad.set_regex("(?=x)");
  EXPECT_FALSE(ConstrainAnswerOnly(ReasoningParser::kQwen3, ReasoningStart::kMayOpen, &bad).ok());
}

}  // namespace
}  // namespace tandem
