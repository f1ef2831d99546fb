// The matcher's token masks (trie walk + state cache) against a brute-force reference: the plain
// Earley recognizer of reference_recognizer.h, run on every token's bytes after the prefix, over
// the bundled tokenizers and several grammars, at prefixes reached by random walks.

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/grammar/reference_recognizer.h"
#include "tests/util/sanitizer.h"
#include "tests/util/test_paths.h"

namespace tandem::grammar {
namespace {

bool Allowed(const TokenMask& mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

struct Tok {
  const char* name;
  const char* dir;
};
const Tok kTokenizers[] = {
    {"stories260k", "models/stories260k"},    {"llama2", "tests/data/tokenizers/llama2"},
    {"gpt2", "tests/data/tokenizers/gpt2"},   {"llama3", "tests/data/tokenizers/llama3"},
    {"qwen3", "tests/data/tokenizers/qwen3"},
};

std::vector<std::string> Grammars() {
  std::vector<std::string> out;
  out.push_back(AnyJsonGrammar(/*object_only=*/true));
  auto schema = JsonSchemaToGrammar(R"({"type":"object","properties":{
      "id":{"type":"integer"},"name":{"type":"string","maxLength":12},
      "kind":{"enum":["a b","ü","x\"y"]},
      "tags":{"type":"array","items":{"$ref":"#/$defs/tag"},"minItems":1,"maxItems":3}},
      "required":["id","kind"],"$defs":{"tag":{"anyOf":[{"type":"null"},{"type":"boolean"},
      {"type":"string","pattern":"^[a-z]+-[0-9]{2}$"}]}}})");
  EXPECT_TRUE(schema.ok()) << schema.status();
  out.push_back(*schema);
  out.push_back(R"(root ::= ( greeting " " )+ name "."
                   greeting ::= "Hello" | "¡Hola" | "你好"
                   name ::= [A-Z] [a-zé]* )");
  out.push_back(R"(root ::= ( [^\n]* "\n" ){2,4})");
  return out;
}

TEST(MaskReferenceTest, MasksEqualBruteForceOnBundledTokenizers) {
  int64_t pairs = 0, tokens_checked = 0;
  for (const Tok& t : kTokenizers) {
    auto tok = Tokenizer::FromModelDir(tandem::TestSourceDir() + "/" + t.dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto vocab = TokenVocab::FromTokenizer(**tok);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    const int32_t n = (*vocab)->size();
    // Small vocabularies: every token at many prefixes; large ones: fewer prefixes. Under a
    // sanitizer (much slower; its stage checks memory, the main suite the coverage) a
    // quarter of the walks and steps.
    const int scale = kUnderSanitizer ? 4 : 1;
    const int walks = n < 1000 ? 12 / scale : 1;
    const int steps = (n < 1000 ? 40 : 8) / scale;
    std::mt19937 rng(11);
    for (const std::string& text : Grammars()) {
      auto g = ParseGrammar(text);
      ASSERT_TRUE(g.ok()) << g.status();
      auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g), *vocab);
      for (int w = 0; w < walks; ++w) {
        GrammarMatcher m(compiled);
        ReferenceRecognizer ref(compiled->grammar());
        for (int s = 0; s < steps; ++s) {
          auto mask = m.NextTokenMask();
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < n; ++id) {
            const std::string& b = (*vocab)->bytes(id);
            bool ok = !b.empty();
            size_t pushed = 0;
            for (size_t i = 0; ok && i < b.size(); ++i) {
              ok = ref.Push(static_cast<unsigned char>(b[i]));
              if (ok) ++pushed;
            }
            for (size_t i = 0; i < pushed; ++i) ref.Pop();
            ASSERT_EQ(Allowed(*mask, id), ok)
                << t.name << " token " << id << " '" << b << "' at step " << s << "\n"
                << text;
            if (ok) allowed.push_back(id);
          }
          ++pairs;
          tokens_checked += n;
          if (allowed.empty()) break;
          const int32_t pick = allowed[rng() % allowed.size()];
          ASSERT_TRUE(m.AcceptToken(pick));
          for (char c : (*vocab)->bytes(pick)) ASSERT_TRUE(ref.Push(static_cast<unsigned char>(c)));
        }
      }
    }
  }
  std::printf("compared %lld (grammar, prefix) masks, %lld token checks\n",
              static_cast<long long>(pairs), static_cast<long long>(tokens_checked));
}

}  // namespace
}  // namespace tandem::grammar
