// Pre-tokenizers, normalizers and decoders on strings (HF documentation examples).
#include "common/tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

std::vector<std::string> PreTokenize(const nlohmann::json& json, const std::string& text) {
  auto pre_tokenizer = PreTokenizerFromJson(json);
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  if (!pre_tokenizer.ok()) return {};
  std::vector<PreToken> pieces = {{text, true}};
  (*pre_tokenizer)->PreTokenize(&pieces);
  std::vector<std::string> out;
  for (const PreToken& piece : pieces) out.push_back(piece.text);
  return out;
}

nlohmann::json SplitDash(const char* behavior) {
  return {
      {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
}

using Strings = std::vector<std::string>;

TEST(PreTokenizerTest, SplitBehaviors) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(PreTokenize(SplitDash("Removed"), text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitDash("Isolated"), text),
            (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitDash("MergedWithPrevious"), text),
            (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitDash("MergedWithNext"), text),
            (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(PreTokenize(SplitDash("Contiguous"), text),
            (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizerTest, SplitRegexInvert) {
  const nlohmann::json split = {{"type", "Split"},
                                {"pattern", {{"Regex", "\\d+"}}},
                                {"behavior", "Removed"},
                                {"invert", true}};
  EXPECT_EQ(PreTokenize(split, "ab12cd345"), (Strings{"12", "345"}));
}

TEST(PreTokenizerTest, ByteLevel) {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  EXPECT_EQ(PreTokenize(byte_level, "Hello my friend"), (Strings{"\xC4\xA0Hello", "\xC4\xA0my",
                                                                 "\xC4\xA0"
                                                                 "friend"}));
  const nlohmann::json no_regex = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(PreTokenize(no_regex, "a b\n"), (Strings{"a\xC4\xA0"
                                                     "b\xC4\x8A"}));
}

TEST(PreTokenizerTest, MetaspaceAndWhitespace) {
  const nlohmann::json metaspace = {{"type", "Metaspace"},
                                    {"replacement", "\xE2\x96\x81"},
                                    {"prepend_scheme", "always"},
                                    {"split", true}};
  EXPECT_EQ(PreTokenize(metaspace, "Hey friend"), (Strings{"\xE2\x96\x81Hey",
                                                           "\xE2\x96\x81"
                                                           "friend"}));
  EXPECT_EQ(PreTokenize({{"type", "Whitespace"}}, "Hey man!! ok"),
            (Strings{"Hey", "man", "!!", "ok"}));
  EXPECT_EQ(PreTokenize({{"type", "WhitespaceSplit"}}, "Hey man!!\tok"),
            (Strings{"Hey", "man!!", "ok"}));
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", true}}, "a123"),
            (Strings{"a", "1", "2", "3"}));
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", false}}, "a123b"),
            (Strings{"a", "123", "b"}));
  EXPECT_EQ(PreTokenize({{"type", "BertPreTokenizer"}}, "Hey, you!"),
            (Strings{"Hey", ",", "you", "!"}));
}

std::string Normalize(const nlohmann::json& json, std::string text) {
  auto normalizer = NormalizerFromJson(json);
  EXPECT_TRUE(normalizer.ok()) << normalizer.status();
  if (normalizer.ok()) (*normalizer)->Normalize(&text);
  return text;
}

TEST(NormalizerTest, Steps) {
  EXPECT_EQ(Normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                      " \t hi \xC2\xA0"),
            "hi");
  EXPECT_EQ(Normalize({{"type", "Lowercase"}}, "HeLLo"), "hello");
  EXPECT_EQ(Normalize({{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", "_"}}, ""), "");
  EXPECT_EQ(Normalize({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}},
                      "a   b  c d"),
            "a b c d");
  EXPECT_FALSE(NormalizerFromJson({{"type", "Precompiled"}}).ok());
}

std::string Decode(const nlohmann::json& json, std::vector<std::string> tokens) {
  auto decoder = DecoderFromJson(json);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  if (!decoder.ok()) return "";
  (*decoder)->DecodeChain(&tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

TEST(DecoderTest, Steps) {
  EXPECT_EQ(
      Decode({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}},
             {"\xE2\x96\x81Hey",
              "\xE2\x96\x81"
              "friend"}),
      "Hey friend");
  EXPECT_EQ(Decode({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}, {"  a  "}),
            " a ");
  EXPECT_EQ(Decode({{"type", "ByteLevel"}}, {"\xC4\xA0Hello", "\xC4\xA0\xC3\xB0\xC5\x81"}),
            " Hello \xEF\xBF\xBD");
}

}  // namespace
}  // namespace tandem
