// The matcher's token masks (trie walk + state cache) against a brute-force reference: a plain
// Earley recognizer written independently here, run on every token's bytes after the prefix,
// over the bundled tokenizers and several grammars, at prefixes reached by random walks.

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

namespace tandem::grammar {
namespace {

// Textbook Earley (fixpoint closure, no nullable shortcut), a set per input byte.
class ReferenceRecognizer {
 public:
  explicit ReferenceRecognizer(const Grammar& g) : g_(g) {
    sets_.emplace_back();
    for (int32_t p : g_.rule_productions[g_.root]) Add(0, {p, 0, 0});
    Close(0);
  }

  bool Push(unsigned char byte) {
    const size_t cur = sets_.size() - 1;
    std::vector<Item> next;
    for (const Item& it : sets_[cur]) {
      if (it.dot == g_.Length(it.prod)) continue;
      const int32_t s = g_.SymbolAt(it.prod, it.dot);
      if (s < 0 && g_.terminals[~s].test(byte)) next.push_back({it.prod, it.dot + 1, it.origin});
    }
    if (next.empty()) return false;
    sets_.emplace_back();
    for (const Item& it : next) Add(cur + 1, it);
    Close(cur + 1);
    return true;
  }
  void Pop() { sets_.pop_back(); }
  size_t depth() const { return sets_.size(); }

 private:
  struct Item {
    int32_t prod, dot, origin;
    bool operator==(const Item& o) const {
      return prod == o.prod && dot == o.dot && origin == o.origin;
    }
  };
  void Add(size_t k, const Item& it) {
    for (const Item& x : sets_[k]) {
      if (x == it) return;
    }
    sets_[k].push_back(it);
  }
  void Close(size_t k) {
    for (bool changed = true; changed;) {
      changed = false;
      const size_t before = sets_[k].size();
      for (size_t i = 0; i < sets_[k].size(); ++i) {
        const Item it = sets_[k][i];
        if (it.dot < g_.Length(it.prod)) {
          const int32_t s = g_.SymbolAt(it.prod, it.dot);
          if (s >= 0) {
            for (int32_t p : g_.rule_productions[s]) Add(k, {p, 0, static_cast<int32_t>(k)});
          }
        } else {
          const int32_t lhs = g_.productions[it.prod].lhs;
          const std::vector<Item> origin = sets_[it.origin];  // copy: may be set k itself
          for (const Item& w : origin) {
            if (w.dot < g_.Length(w.prod) && g_.SymbolAt(w.prod, w.dot) == lhs) {
              Add(k, {w.prod, w.dot + 1, w.origin});
            }
          }
        }
      }
      changed = sets_[k].size() != before;
    }
  }
  const Grammar& g_;
  std::vector<std::vector<Item>> sets_;
};

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
    auto tok = Tokenizer::FromModelDir(std::string(TANDEM_SOURCE_DIR) + "/" + t.dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto vocab = TokenVocab::FromTokenizer(**tok);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    const int32_t n = (*vocab)->size();
    // Small vocabularies: every token at many prefixes; large ones: fewer prefixes.
    const int walks = n < 1000 ? 12 : 1;
    const int steps = n < 1000 ? 40 : 8;
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
