#include "common/grammar/matcher.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/reference/reference_paths.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const std::string& text,
                                               std::shared_ptr<const TokenVocab> vocab) {
  auto g = ParseGrammar(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const CompiledGrammar>(std::move(*g), std::move(vocab));
}

bool Allowed(const TokenMask& mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

std::vector<int32_t> AllowedIds(const TokenMask& mask, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    if (Allowed(mask, i)) out.push_back(i);
  }
  return out;
}

TEST(MatcherTest, TokensSpanningSeveralTerminalsAndRules) {
  // Token 0 covers the end of the key string, the colon and the start of the number: three
  // terminals of two rules. Token 4 ends mid-way through a multi-byte character.
  auto vocab = TokenVocab::FromBytes({"\":1", "{\"a", "}", "\"", "\xC3", "\xA9}", ":", "1", ""});
  auto g = Compile(R"(root ::= "{" key ":" num "}" | "{" key ":" "\"" "é" "\"" "}"
                      key ::= "\"a\""
                      num ::= [0-9]+)",
                   vocab);
  GrammarMatcher m(g);
  EXPECT_EQ(AllowedIds(*m.NextTokenMask(), vocab->size()), std::vector<int32_t>({1}));
  ASSERT_TRUE(m.AcceptToken(1));
  EXPECT_EQ(AllowedIds(*m.NextTokenMask(), vocab->size()), std::vector<int32_t>({0, 3}));
  ASSERT_TRUE(m.AcceptToken(0));
  EXPECT_EQ(AllowedIds(*m.NextTokenMask(), vocab->size()), std::vector<int32_t>({2, 7}));
  EXPECT_FALSE(m.CanTerminate());
  ASSERT_TRUE(m.AcceptToken(2));
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_TRUE(AllowedIds(*m.NextTokenMask(), vocab->size()).empty());
  // Roll back to after `{"a` and take the string branch through a split character.
  m.Rollback(2);
  EXPECT_EQ(m.num_tokens(), 1);
  ASSERT_TRUE(m.AcceptToken(3));   // "
  EXPECT_FALSE(m.AcceptToken(3));  // refused: state unchanged
  ASSERT_TRUE(m.AcceptToken(6));   // :
  ASSERT_TRUE(m.AcceptBytes("\""));
  ASSERT_TRUE(m.AcceptToken(4));  // first byte of é
  // Token 5 continues the character but closes with } where the grammar wants the quote first.
  EXPECT_EQ(AllowedIds(*m.NextTokenMask(), vocab->size()), std::vector<int32_t>({}));
  ASSERT_TRUE(m.AcceptBytes("\xA9\"}"));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.AcceptToken(8));  // the empty token is never allowed
}

TEST(MatcherTest, RollbackRestoresMasksExactly) {
  std::vector<std::string> bytes;
  for (char c = ' '; c <= '~'; ++c) bytes.push_back(std::string(1, c));
  bytes.push_back("{\"");
  bytes.push_back("\":");
  bytes.push_back("\",\"");
  bytes.push_back("true");
  bytes.push_back("null}");
  auto vocab = TokenVocab::FromBytes(bytes);
  auto g = Compile(AnyJsonGrammar(false), vocab);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    GrammarMatcher m(g);
    std::vector<TokenMask> masks = {ReferencePaths::UncachedMask(m)};
    for (int step = 0; step < 30 && !m.IsTerminated(); ++step) {
      std::vector<int32_t> ids = AllowedIds(masks.back(), vocab->size());
      if (ids.empty()) break;
      ASSERT_TRUE(m.AcceptToken(ids[rng() % ids.size()]));
      masks.push_back(ReferencePaths::UncachedMask(m));
      EXPECT_EQ(*m.NextTokenMask(), masks.back());
    }
    while (m.num_tokens() > 0) {
      const int32_t k = std::min<int32_t>(m.num_tokens(), 1 + static_cast<int32_t>(rng() % 3));
      m.Rollback(k);
      masks.resize(masks.size() - k);
      EXPECT_EQ(ReferencePaths::UncachedMask(m), masks.back());
    }
  }
}

// Mask cost on a JSON-schema grammar over a synthetic 32k-token vocabulary: uncached (full trie
// walk) against the state cache, printed for the record (no timing assertion).
TEST(MatcherTest, MaskCostMicroBenchmark) {
  std::mt19937 rng(1);
  std::vector<std::string> bytes;
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789\"{}[],:.-_";
  for (int i = 0; i < 32000; ++i) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 7);
    for (int k = 0; k < len; ++k) t.push_back(alphabet[rng() % alphabet.size()]);
    bytes.push_back(t);
  }
  auto vocab = TokenVocab::FromBytes(bytes);
  auto text = JsonSchemaToGrammar(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]})");
  ASSERT_TRUE(text.ok()) << text.status();
  auto g = Compile(*text, vocab);
  double uncached_us = 0, cached_us = 0;
  int steps = 0;
  for (int trial = 0; trial < 5; ++trial) {
    GrammarMatcher m(g);
    for (int step = 0; step < 40 && !m.IsTerminated(); ++step) {
      auto t0 = std::chrono::steady_clock::now();
      TokenMask full = ReferencePaths::UncachedMask(m);
      auto t1 = std::chrono::steady_clock::now();
      auto mask = m.NextTokenMask();
      auto t2 = std::chrono::steady_clock::now();
      ASSERT_EQ(*mask, full);
      uncached_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      cached_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
      ++steps;
      std::vector<int32_t> ids = AllowedIds(full, vocab->size());
      if (ids.empty()) break;
      ASSERT_TRUE(m.AcceptToken(ids[rng() % ids.size()]));
    }
  }
  std::printf(
      "mask per token over %d steps: uncached %.1f us, with the state cache %.1f us "
      "(hits %lld, misses %lld)\n",
      steps, uncached_us / steps, cached_us / steps, static_cast<long long>(g->cache_hits()),
      static_cast<long long>(g->cache_misses()));
}

TEST(GrammarCompilerTest, CachesByContentAndReportsErrors) {
  auto vocab = TokenVocab::FromBytes({"a", "b"});
  GrammarCompiler compiler(vocab);
  Constraint c;
  c.kind = Constraint::Kind::kRegex;
  c.value = "a+b";
  auto first = compiler.Compile(c);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = compiler.Compile(c);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(compiler.hits(), 1);
  c.value = "a(";
  EXPECT_EQ(compiler.Compile(c).status().code(), absl::StatusCode::kInvalidArgument);
  Constraint choice;
  choice.kind = Constraint::Kind::kChoice;
  choice.choices = {"ab", "b"};
  auto ch = compiler.Compile(choice);
  ASSERT_TRUE(ch.ok()) << ch.status();
  GrammarMatcher m(*ch);
  EXPECT_TRUE(m.AcceptToken(0));
  EXPECT_TRUE(m.AcceptToken(1));
  EXPECT_TRUE(m.IsTerminated());
}

}  // namespace
}  // namespace tandem::grammar
