// The state graph's memory bound: a hostile (exponentially ambiguous) grammar is refused with
// RESOURCE_EXHAUSTED naming the bound once it needs more states than the bound allows, nothing
// past the bound is allocated, and the compiler then evicts the exhausted grammar.

#include <memory>
#include <string>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

// Every prefix of a^n is a new Earley set with n more items: the graph grows with the output.
const char kAmbiguous[] = R"(root ::= root root | "a" | "aa")";

std::shared_ptr<const TokenVocab> Vocab() { return TokenVocab::FromBytes({"a", "aa", "b"}); }

TEST(StateGraphBoundTest, HostileGrammarIsRefusedAtTheBound) {
  auto g = ParseGrammar(kAmbiguous);
  ASSERT_TRUE(g.ok()) << g.status();
  CompiledGrammarOptions options;
  options.max_graph_bytes = 1 << 20;
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g), Vocab(), options);
  GrammarMatcher m(compiled);
  int accepted = 0;
  for (; accepted < 100000; ++accepted) {
    auto mask = m.NextTokenMask();
    if (!m.status().ok()) break;
    ASSERT_TRUE(((*mask)[0] & 1) != 0) << "token 'a' must stay allowed";
    if (!m.AcceptToken(0)) break;
  }
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_NE(m.status().message().find("1 MiB"), std::string::npos) << m.status();
  EXPECT_GT(accepted, 10);  // it served until the bound, not before
  std::lock_guard<std::mutex> lock(compiled->graph().mu());
  EXPECT_TRUE(compiled->graph().exhausted());
  EXPECT_LE(compiled->graph().bytes(), compiled->graph().max_bytes());
}

TEST(StateGraphBoundTest, ExhaustedGrammarIsEvictedFromTheCompilerCache) {
  CompiledGrammarOptions options;
  options.max_graph_bytes = 256 << 10;
  GrammarCompiler compiler(Vocab(), 16, {}, options);
  Constraint c;
  c.kind = Constraint::Kind::kGrammar;
  c.value = kAmbiguous;
  auto first = compiler.Compile(c);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = compiler.Compile(c);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first, *again);  // cached while healthy
  GrammarMatcher m(*first);
  while (m.status().ok() && m.AcceptToken(1)) m.NextTokenMask();
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("256 KiB"), std::string::npos) << m.status();
  auto fresh = compiler.Compile(c);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(*fresh, *first);  // a new graph for new requests
  GrammarMatcher n(*fresh);
  EXPECT_TRUE(n.AcceptToken(0));
  EXPECT_TRUE(n.status().ok());
}

TEST(StateGraphBoundTest, OrdinaryGrammarsStayFarBelowTheDefaultBound) {
  auto g = ParseGrammar(R"(root ::= "[" ( [0-9]+ ( "," [0-9]+ )* )? "]")");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<const CompiledGrammar>(
      std::move(*g), TokenVocab::FromBytes({"[", "]", ",", "1", "23", ",4", "5]"}));
  GrammarMatcher m(compiled);
  for (int32_t t : {0, 3, 5, 5, 4, 5, 6}) ASSERT_TRUE(m.AcceptToken(t)) << t;
  EXPECT_TRUE(m.IsTerminated());
  std::lock_guard<std::mutex> lock(compiled->graph().mu());
  EXPECT_FALSE(compiled->graph().exhausted());
  EXPECT_LT(compiled->graph().bytes(), 1 << 20);
}

}  // namespace
}  // namespace tandem::grammar
