#include "common/grammar/grammar_parser.h"

#include <chrono>
#include <memory>
#include <string>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/matcher.h"
#include "common/grammar/regex_to_grammar.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

// Whether `text` is a complete sentence of `grammar`.
bool Matches(const std::string& grammar, const std::string& text) {
  auto g = ParseGrammar(grammar);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return false;
  auto vocab = TokenVocab::FromBytes({"a"});
  auto compiled = std::make_shared<CompiledGrammar>(std::move(*g), vocab);
  GrammarMatcher m(compiled);
  return m.AcceptBytes(text) && m.CanTerminate();
}

TEST(GrammarParserTest, LiteralsClassesAndRepetition) {
  const std::string g = R"(root ::= "x" [a-c]+ ( "-" [0-9]{2,3} )? tail
    tail ::= "!" | ""  # optional bang
  )";
  EXPECT_TRUE(Matches(g, "xa"));
  EXPECT_TRUE(Matches(g, "xabc-12!"));
  EXPECT_TRUE(Matches(g, "xc-123"));
  EXPECT_FALSE(Matches(g, "x"));
  EXPECT_FALSE(Matches(g, "xa-1"));
  EXPECT_FALSE(Matches(g, "xa-1234"));
  EXPECT_FALSE(Matches(g, "xd"));
}

TEST(GrammarParserTest, UnicodeClassesMatchUtf8) {
  const std::string g = R"(root ::= [^"a]* "." [é-ê] [\u4e00-\u4e01])";
  EXPECT_TRUE(Matches(g, "bç😀.é一"));
  EXPECT_TRUE(Matches(g, ".ê丁"));
  EXPECT_FALSE(Matches(g, "a.é一"));
  EXPECT_FALSE(Matches(g, ".è一"));
  EXPECT_FALSE(Matches(g, "\xff.é一"));  // invalid UTF-8 is never in a negated class
}

TEST(GrammarParserTest, LeftAndRightRecursionAndNullable) {
  const std::string g = R"~(root ::= list
    list ::= list "," item | item
    item ::= "(" inner ")" | "i"
    inner ::= opt root opt
    opt ::= "" | " ")~";
  EXPECT_TRUE(Matches(g, "i"));
  EXPECT_TRUE(Matches(g, "i,( i,(i) ),i"));
  EXPECT_FALSE(Matches(g, "i,"));
  EXPECT_FALSE(Matches(g, "((i)"));
}

TEST(GrammarParserTest, ErrorsNameLineAndColumn) {
  auto bad = ParseGrammar("root ::= \"a\"\nfoo ::= [a-");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseGrammar("root ::= undefined-rule").ok());
  EXPECT_FALSE(ParseGrammar("other ::= \"a\"").ok());  // no root
  EXPECT_FALSE(ParseGrammar("root ::= \"a\"\nroot ::= \"b\"").ok());
  EXPECT_FALSE(ParseGrammar("root ::= ( \"a\" ").ok());
  EXPECT_FALSE(ParseGrammar("root ::= \"a\"{5,2}").ok());
  EXPECT_FALSE(ParseGrammar("root ::= root").ok());  // matches nothing
  EXPECT_FALSE(ParseGrammar("root ::= \"\\x4\"").ok());
}

TEST(GrammarParserTest, BoundsRefuseHugeGrammars) {
  // Nested repetition multiplies: refused by the symbol bound, not by running out of memory.
  GrammarLimits limits;
  limits.max_symbols = 100000;
  auto big = ParseGrammar("root ::= \"" + std::string(200, 'z') + "\"{1000}", limits);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too large"), std::string::npos) << big.status();
  // Groups are rules of their own, so nesting repetitions stays linear and is accepted.
  EXPECT_TRUE(ParseGrammar("root ::= ((\"abcdefgh\"{1000}){1000}){1000}", limits).ok());
  EXPECT_FALSE(ParseGrammar("root ::= \"a\"{100000}").ok());
  std::string deep = "root ::= ";
  for (int i = 0; i < 500; ++i) deep += "(";
  deep += "\"a\"";
  for (int i = 0; i < 500; ++i) deep += ")";
  EXPECT_FALSE(ParseGrammar(deep).ok());
}

// Rules defined after their use, each depending on the next: the analysis of nullable and
// productive rules is a worklist, linear in the grammar (the earlier fixpoint made one pass over
// every production per rule of the chain: 16k rules took 4 s, 100k about 160 s).
std::string ReverseChain(int n, const std::string& last) {
  // r_i ::= r_{i+1} "a" | r_{i+1}: root matches last a{0,n-1}.
  std::string t = "root ::= r1\n";
  for (int i = 1; i < n; ++i) {
    const std::string next = "r" + std::to_string(i + 1);
    t += "r" + std::to_string(i) + " ::= " + next + " \"a\" | " + next + "\n";
  }
  return t + "r" + std::to_string(n) + " ::= " + last + "\n";
}

TEST(GrammarParserTest, RuleAnalysisIsLinearInRuleOrder) {
  // 100k rules in a chain, each productive and nullable only through the next one.
  const auto t0 = std::chrono::steady_clock::now();
  auto g = ParseGrammar(ReverseChain(99999, "\"b\""));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_LT(seconds, 20.0);  // about 0.1 s; the quadratic analysis took minutes
  EXPECT_FALSE(g->nullable[g->root]);
  // The same chain is nullable once its last rule is, and refused when the last never ends.
  auto nullable = ParseGrammar(ReverseChain(2000, "\"\""));
  ASSERT_TRUE(nullable.ok()) << nullable.status();
  EXPECT_TRUE(nullable->nullable[nullable->root]);
  EXPECT_TRUE(Matches(ReverseChain(50, "\"b\""), "baaa"));
  EXPECT_TRUE(Matches(ReverseChain(50, "\"b\""), "b"));
  EXPECT_FALSE(Matches(ReverseChain(50, "\"b\""), "aaab"));
  EXPECT_FALSE(Matches(ReverseChain(50, "\"b\""), "b" + std::string(50, 'a')));
  EXPECT_FALSE(ParseGrammar("root ::= a\na ::= b \"x\"\nb ::= a").ok());  // never ends
}

TEST(GrammarParserTest, BudgetCutsAParse) {
  CompileBudget budget(/*cpu_ms=*/1);
  auto g = ParseGrammar(ReverseChain(99999, "\"b\""), {}, &budget);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("budget of 1 ms"), std::string::npos) << g.status();
  CompileBudget cancelled;
  cancelled.Cancel();
  EXPECT_EQ(ParseGrammar("root ::= \"a\"", {}, &cancelled).status().code(),
            absl::StatusCode::kCancelled);
  CompileBudget ample(/*cpu_ms=*/60000);
  EXPECT_TRUE(ParseGrammar("root ::= \"a\"", {}, &ample).ok());
}

bool RegexMatches(const std::string& re, const std::string& text) {
  auto expr = RegexToGrammarExpr(re);
  EXPECT_TRUE(expr.ok()) << expr.status();
  if (!expr.ok()) return false;
  return Matches("root ::= " + *expr, text);
}

TEST(RegexToGrammarTest, CommonSyntax) {
  EXPECT_TRUE(RegexMatches(R"(^\d{3}-\d{4}$)", "555-1234"));
  EXPECT_FALSE(RegexMatches(R"(^\d{3}-\d{4}$)", "555-123"));
  EXPECT_TRUE(RegexMatches("(cat|dog)s?", "dogs"));
  EXPECT_FALSE(RegexMatches("(cat|dog)s?", "cow"));
  EXPECT_TRUE(RegexMatches(R"([A-Z][a-z]*\s\w+\.)", "Hello world."));
  EXPECT_TRUE(RegexMatches(R"([^0-9]+)", "abc"));
  EXPECT_FALSE(RegexMatches(R"([^0-9]+)", "a1"));
  EXPECT_TRUE(RegexMatches(R"(a.c)", "a☃c"));
  EXPECT_TRUE(RegexMatches(R"((?:ab)+?x)", "ababx"));
  EXPECT_FALSE(RegexToGrammarExpr("(?=a)b").ok());
  EXPECT_FALSE(RegexToGrammarExpr(R"((a)\1)").ok());
  EXPECT_FALSE(RegexToGrammarExpr("a(b").ok());
  EXPECT_FALSE(RegexToGrammarExpr("*a").ok());
}

}  // namespace
}  // namespace tandem::grammar
