// Masks from context-independent position sets (plus the context check of the uncertain rest)
// against the full trie walk and a brute-force reference (every token's bytes tried with an
// independent Earley recognizer), on grammars where the context decides: a rule ending into
// different parents, nested and recursive rules, any-JSON and a recursive JSON schema, on a
// synthetic vocabulary of short multi-terminal tokens and on the bundled tokenizers.

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/grammar/reference/reference_paths.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/grammar/reference_recognizer.h"
#include "tests/util/sanitizer.h"
#include "tests/util/test_paths.h"

namespace tandem::grammar {
namespace {

bool Allowed(const TokenMask& mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

std::shared_ptr<const CompiledGrammar> Compile(const std::string& text,
                                               std::shared_ptr<const TokenVocab> vocab) {
  auto g = ParseGrammar(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(std::move(*g), std::move(vocab));
}

const char kParents[] = R"(root ::= "a" x "b" | "c" x "d" x "e"
                           x ::= "<" y ">" | [x-z]+
                           y ::= "." [x-z] "." | x)";

TEST(PositionMaskTest, OnePositionTwoParents) {
  // Inside `y` (called by `x`, called by `root`) the position is the same whichever parent
  // called `x`; what may follow the end of `x` ("b" or "d") is the context's to decide.
  auto vocab = TokenVocab::FromBytes({"a", "c", "<.", "y.>b", "y.>d", "y", "z.>d<.", "b", "d"});
  auto g = Compile(kParents, vocab);
  GrammarMatcher first(g), second(g);
  ASSERT_TRUE(first.AcceptToken(0));
  ASSERT_TRUE(first.AcceptToken(2));  // a<.  (inside y, which cannot end here)
  ASSERT_TRUE(second.AcceptToken(1));
  ASSERT_TRUE(second.AcceptToken(2));  // c<.
  StateGraph& graph = g->graph();
  int32_t p1, p2;
  {
    std::lock_guard<std::mutex> lock(graph.mu());
    ASSERT_NE(first.state(), second.state());
    p1 = graph.Position(first.state());
    p2 = graph.Position(second.state());
  }
  EXPECT_EQ(p1, p2);
  const TokenMask a = ReferencePaths::MaskByPosition(first);
  const TokenMask b = ReferencePaths::MaskByPosition(second);
  auto ids = [&](const TokenMask& m) {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < vocab->size(); ++i) {
      if (Allowed(m, i)) out.push_back(i);
    }
    return out;
  };
  EXPECT_EQ(ids(a), (std::vector<int32_t>{3, 5}));     // y.>b, y
  EXPECT_EQ(ids(b), (std::vector<int32_t>{4, 5, 6}));  // y.>d, y, z.>d<.
  EXPECT_EQ(a, ReferencePaths::UncachedMask(first));
  EXPECT_EQ(b, ReferencePaths::UncachedMask(second));
  EXPECT_GE(g->position_hits(), 1);  // the second state reused the first one's position sets
}

// Every string of length 1 and 2 over `alphabet`, and random longer ones.
std::shared_ptr<const TokenVocab> SyntheticVocab(const std::string& alphabet, int longer,
                                                 std::mt19937& rng) {
  std::vector<std::string> out = {""};
  for (char a : alphabet) {
    out.push_back(std::string(1, a));
    for (char b : alphabet) out.push_back(std::string{a, b});
  }
  for (int i = 0; i < longer; ++i) {
    std::string s;
    for (int n = 3 + static_cast<int>(rng() % 4); n > 0; --n)
      s.push_back(alphabet[rng() % alphabet.size()]);
    out.push_back(s);
  }
  return TokenVocab::FromBytes(std::move(out));
}

struct Stats {
  int64_t pairs = 0;
  int64_t contextual = 0;         // states whose position differs from the state
  int64_t uncertain_allowed = 0;  // uncertain tokens the context allowed
  int64_t uncertain_refused = 0;  // and refused
};

// Random walks under `text`: at each step the cached mask, the position mask, the full trie walk
// and the brute-force reference agree; a few rollbacks on the way.
void CompareWalks(const std::string& text, std::shared_ptr<const TokenVocab> vocab, int walks,
                  int steps, Stats* stats) {
  auto g = Compile(text, vocab);
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(23);
  const int32_t n = vocab->size();
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    ReferenceRecognizer ref(g->grammar());
    std::vector<int32_t> taken;
    for (int s = 0; s < steps; ++s) {
      const TokenMask by_position = ReferencePaths::MaskByPosition(m);
      ASSERT_EQ(*m.NextTokenMask(), by_position);
      ASSERT_EQ(ReferencePaths::UncachedMask(m), by_position) << text;
      std::shared_ptr<const PositionTokens> sets;
      {
        std::lock_guard<std::mutex> lock(g->graph().mu());
        const int32_t p = g->graph().Position(m.state());
        if (p != m.state()) {
          ++stats->contextual;
          sets = g->FindPosition(p);
        }
      }
      if (sets != nullptr) {
        for (int32_t id : sets->uncertain) {
          ++(Allowed(by_position, id) ? stats->uncertain_allowed : stats->uncertain_refused);
          ASSERT_FALSE(Allowed(sets->accepted, id));
        }
      }
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < n; ++id) {
        const std::string& b = vocab->bytes(id);
        bool ok = !b.empty();
        size_t pushed = 0;
        for (size_t i = 0; ok && i < b.size(); ++i) {
          ok = ref.Push(static_cast<unsigned char>(b[i]));
          if (ok) ++pushed;
        }
        for (size_t i = 0; i < pushed; ++i) ref.Pop();
        ASSERT_EQ(Allowed(by_position, id), ok)
            << "token " << id << " '" << b << "' at step " << s << "\n"
            << text;
        if (ok) allowed.push_back(id);
      }
      ++stats->pairs;
      if (allowed.empty()) break;
      // Now and then undo the last token and take another.
      if (!taken.empty() && rng() % 5 == 0) {
        m.Rollback(1);
        for (size_t i = 0; i < vocab->bytes(taken.back()).size(); ++i) ref.Pop();
        taken.pop_back();
        continue;
      }
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(pick));
      for (char c : vocab->bytes(pick)) ASSERT_TRUE(ref.Push(static_cast<unsigned char>(c)));
      taken.push_back(pick);
    }
  }
}

std::vector<std::string> ContextGrammars() {
  std::vector<std::string> out = {
      kParents,
      // Nesting and recursion: a string or number ends into an array at any depth.
      R"(root ::= value
         value ::= "[" ( value ( "," value )* )? "]" | str | [0-9]+
         str ::= "\"" [a-z ]* "\"")",
      // Only the context (the stack of open letters) knows what closes.
      R"(root ::= "a" root "a" | "b" root "b" | "c" | "[" root "]")",
      AnyJsonGrammar(/*object_only=*/false),
  };
  auto schema = JsonSchemaToGrammar(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"n":{"type":"string","maxLength":3},"k":{"type":"array",
      "items":{"$ref":"#/$defs/node"}}},"required":["n"]}}})");
  EXPECT_TRUE(schema.ok()) << schema.status();
  if (schema.ok()) out.push_back(*schema);
  return out;
}

TEST(PositionMaskTest, MasksEqualBruteForceWhereContextDecides) {
  std::mt19937 rng(7);
  auto vocab = SyntheticVocab("abcdexyz.<>[],\"0 1{}:ntrue", 400, rng);
  Stats stats;
  for (const std::string& text : ContextGrammars()) {
    CompareWalks(text, vocab, 6, 40, &stats);
    if (HasFatalFailure()) return;
  }
  std::printf("%lld masks, %lld in a context, uncertain tokens: %lld allowed, %lld refused\n",
              static_cast<long long>(stats.pairs), static_cast<long long>(stats.contextual),
              static_cast<long long>(stats.uncertain_allowed),
              static_cast<long long>(stats.uncertain_refused));
  // The context-dependent path was exercised both ways.
  EXPECT_GT(stats.contextual, 50);
  EXPECT_GT(stats.uncertain_allowed, 100);
  EXPECT_GT(stats.uncertain_refused, 100);
}

TEST(PositionMaskTest, MasksEqualBruteForceOnBundledTokenizers) {
  Stats stats;
  // Under a sanitizer (its stage checks memory; this suite the coverage) three of the five
  // vocabularies: a large one's brute-force walk is most of the test's minutes there.
  std::vector<const char*> dirs = {"models/stories260k", "tests/data/tokenizers/llama2",
                                   "tests/data/tokenizers/qwen3"};
  if (!kUnderSanitizer) {
    dirs.push_back("tests/data/tokenizers/gpt2");
    dirs.push_back("tests/data/tokenizers/llama3");
  }
  for (const char* dir : dirs) {
    auto tok = Tokenizer::FromModelDir(tandem::TestSourceDir() + "/" + dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto vocab = TokenVocab::FromTokenizer(**tok);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    const bool small = (*vocab)->size() < 1000;
    for (const std::string& text : ContextGrammars()) {
      CompareWalks(text, *vocab, small ? 4 : 1, small ? 30 : 5, &stats);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(stats.contextual, 20);
  EXPECT_GT(stats.uncertain_allowed + stats.uncertain_refused, 0);
}

}  // namespace
}  // namespace tandem::grammar
