// Integer and number range grammars against brute force: for many bounds (open, negative,
// crossing zero, across digit counts), every value in a window is accepted exactly when it lies
// within the bounds.

#include "common/grammar/json_schema_numbers.h"

#include "common/grammar/json_schema.h"

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

std::shared_ptr<const TokenVocab> ByteVocab() {
  std::vector<std::string> bytes;
  for (int c = 0x20; c < 0x7F; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  return TokenVocab::FromBytes(bytes);
}

std::shared_ptr<CompiledGrammar> Compile(const std::string& expr) {
  auto g = ParseGrammar(absl::StrCat("root ::= ", expr, "\n"));
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << expr;
  if (!g.ok()) return nullptr;
  return std::make_shared<CompiledGrammar>(std::move(*g), ByteVocab());
}

bool Accepts(const std::shared_ptr<CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return m.AcceptBytes(s) && m.CanTerminate();
}

std::string Show(std::optional<int64_t> v) { return v ? std::to_string(*v) : "open"; }

TEST(JsonSchemaNumbersTest, IntegerRangesMatchBruteForce) {
  std::mt19937 rng(7);
  std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> bounds = {
      {0, 0},
      {-1, 1},
      {0, 9},
      {1, 10},
      {-10, -1},
      {-273, 1000},
      {99, 101},
      {100, 999},
      {5, 5},
      {std::nullopt, -1},
      {-1, std::nullopt},
      {7, std::nullopt},
      {std::nullopt, 12},
      {-1000, -999},
      {19, 291},
      {-1999, 2000}};
  for (int i = 0; i < 40; ++i) {
    int64_t a = static_cast<int64_t>(rng() % 2401) - 1200;
    int64_t b = a + static_cast<int64_t>(rng() % 1300);
    bounds.push_back({a, b});
  }
  for (const auto& [lo, hi] : bounds) {
    const std::string expr = IntegerRangeExpr(lo, hi);
    ASSERT_FALSE(expr.empty()) << Show(lo) << ".." << Show(hi);
    auto g = Compile(expr);
    ASSERT_NE(g, nullptr);
    for (int64_t x = -2600; x <= 2600; ++x) {
      const bool in = (!lo || x >= *lo) && (!hi || x <= *hi);
      ASSERT_EQ(Accepts(g, std::to_string(x)), in)
          << x << " in [" << Show(lo) << ", " << Show(hi) << "]: " << expr;
    }
    EXPECT_FALSE(Accepts(g, "-0"));
    EXPECT_FALSE(Accepts(g, "01"));
  }
  EXPECT_EQ(IntegerRangeExpr(5, 4), "");
  // Wide bounds keep every digit count up to 16.
  auto g = Compile(IntegerRangeExpr(1000000, 2147483647));
  EXPECT_TRUE(Accepts(g, "2147483647"));
  EXPECT_FALSE(Accepts(g, "2147483648"));
  EXPECT_FALSE(Accepts(g, "999999"));
}

TEST(JsonSchemaNumbersTest, NumberRangesMatchBruteForce) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> bounds = {
      {0, 100},           {-50, -10}, {-90, 90}, {0, 0}, {-3, std::nullopt},
      {std::nullopt, -2}, {1, 1},     {-1, 0},   {0, 1}, {std::nullopt, 5},
      {2, std::nullopt}};
  for (const auto& [lo, hi] : bounds) {
    const std::string expr = NumberRangeExpr(lo, hi);
    auto g = Compile(expr);
    ASSERT_NE(g, nullptr);
    for (int64_t q = -480; q <= 480; ++q) {  // quarters from -120 to 120
      const double x = q / 4.0;
      const bool in = (!lo || x >= *lo) && (!hi || x <= *hi);
      char text[32];
      snprintf(text, sizeof(text), "%.2f", x);
      std::string s = text;
      if (s == "-0.00") s = "-0.0";
      ASSERT_EQ(Accepts(g, s), in) << s << " in [" << Show(lo) << ", " << Show(hi) << "]: " << expr;
      if (q % 4 == 0 && q != 0) {
        const std::string i = std::to_string(q / 4);
        ASSERT_EQ(Accepts(g, i), in) << i << ": " << expr;
      }
    }
    EXPECT_FALSE(Accepts(g, "1e3"));
  }
}

TEST(JsonSchemaNumbersTest, MultiplesMatchBruteForce) {
  for (int m : {2, 3, 7, 10, 12, 25, 97, 1000}) {
    auto text = JsonSchemaToGrammar(absl::StrCat(R"({"type":"integer","multipleOf":)", m, "}"));
    ASSERT_TRUE(text.ok()) << text.status();
    auto g = ParseGrammar(*text);
    ASSERT_TRUE(g.ok()) << g.status();
    auto compiled = std::make_shared<CompiledGrammar>(std::move(*g), ByteVocab());
    for (int64_t x = -2100; x <= 2100; ++x) {
      ASSERT_EQ(Accepts(compiled, std::to_string(x)), x % m == 0) << x << " multipleOf " << m;
    }
    EXPECT_TRUE(Accepts(compiled, std::to_string(int64_t{m} * 123456789)));
    EXPECT_FALSE(Accepts(compiled, "-0"));
  }
  auto text = JsonSchemaToGrammar(R"({"type":"number","multipleOf":0.01})");
  ASSERT_TRUE(text.ok()) << text.status();
  auto g = ParseGrammar(*text);
  ASSERT_TRUE(g.ok());
  auto cents = std::make_shared<CompiledGrammar>(std::move(*g), ByteVocab());
  for (const char* ok : {"1", "1.2", "-3.25", "0.01"}) EXPECT_TRUE(Accepts(cents, ok)) << ok;
  for (const char* bad : {"1.255", "1e2", "0.001"}) EXPECT_FALSE(Accepts(cents, bad)) << bad;
  // With bounds: refused rather than approximated.
  EXPECT_FALSE(JsonSchemaToGrammar(R"({"type":"integer","multipleOf":3,"maximum":10})").ok());
}

}  // namespace
}  // namespace tandem::grammar
