// Loading errors, input validation, thread-safety and the BPE/added-token options that the
// vector files do not exercise (checked on small inline tokenizers).
#include "common/tokenizer/tokenizer.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::string DataPath(const std::string& relative) {
  return tandem::TestSourceDir() + "/tests/data/tokenizers/" + relative;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto tokenizer = Tokenizer::FromModelDir(DataPath(name));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// A tokenizer.json with a character-level BPE model over `vocab` and the given extra parts.
std::unique_ptr<Tokenizer> Inline(const nlohmann::json& model, const nlohmann::json& rest = {}) {
  nlohmann::json json = {{"model", model}};
  if (rest.is_object()) {
    for (auto it = rest.begin(); it != rest.end(); ++it) json[it.key()] = it.value();
  }
  auto tokenizer = Tokenizer::FromJsonText(json.dump(), "inline");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& tok, const std::vector<std::string>& tokens) {
  std::vector<int32_t> ids;
  for (const std::string& t : tokens) {
    const auto id = tok.TokenToId(t);
    EXPECT_TRUE(id.has_value()) << t;
    ids.push_back(id.value_or(-1));
  }
  return ids;
}

std::vector<int32_t> Encode(const Tokenizer& tok, const std::string& text) {
  auto ids = tok.Encode(text, /*add_special_tokens=*/false);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

const nlohmann::json kAbcVocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};

TEST(TokenizerTest, MergesAsStringsOrPairsAreEquivalent) {
  auto legacy = Inline({{"type", "BPE"}, {"vocab", kAbcVocab}, {"merges", {"a b", "ab c"}}});
  auto pairs = Inline({{"type", "BPE"},
                       {"vocab", kAbcVocab},
                       {"merges", nlohmann::json::array({{"a", "b"}, {"ab", "c"}})}});
  ASSERT_NE(legacy, nullptr);
  ASSERT_NE(pairs, nullptr);
  EXPECT_EQ(Encode(*legacy, "abc"), Ids(*legacy, {"abc"}));
  EXPECT_EQ(Encode(*pairs, "abc"), Ids(*pairs, {"abc"}));
  EXPECT_EQ(Encode(*legacy, "cab"), Ids(*legacy, {"c", "ab"}));
  EXPECT_EQ(Encode(*pairs, "cab"), Encode(*legacy, "cab"));
}

TEST(TokenizerTest, IgnoreMergesTakesVocabWordsWhole) {
  const nlohmann::json model = {{"vocab", kAbcVocab}, {"merges", {"a b"}}};
  auto plain = Inline(model);
  nlohmann::json ignoring = model;
  ignoring["ignore_merges"] = true;
  auto whole = Inline(ignoring);
  EXPECT_EQ(Encode(*plain, "abc"), Ids(*plain, {"ab", "c"}));
  EXPECT_EQ(Encode(*whole, "abc"), Ids(*whole, {"abc"}));
  EXPECT_EQ(Encode(*whole, "abca"), Ids(*whole, {"ab", "c", "a"}));
}

TEST(TokenizerTest, UnknownTokensFuseOrNot) {
  nlohmann::json model = {{"vocab", {{"<unk>", 0}, {"a", 1}}},
                          {"merges", nlohmann::json::array()},
                          {"unk_token", "<unk>"}};
  auto separate = Inline(model);
  EXPECT_EQ(Encode(*separate, "axyz"), Ids(*separate, {"a", "<unk>", "<unk>", "<unk>"}));
  model["fuse_unk"] = true;
  auto fused = Inline(model);
  EXPECT_EQ(Encode(*fused, "axyza"), Ids(*fused, {"a", "<unk>", "a"}));
  model.erase("unk_token");
  auto dropping = Inline(model);
  EXPECT_EQ(Encode(*dropping, "axa"), Ids(*dropping, {"a", "a"}));
}

TEST(TokenizerTest, ByteFallbackNeedsEveryByte) {
  nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  auto tok = Inline({{"vocab", vocab},
                     {"merges", nlohmann::json::array()},
                     {"unk_token", "<unk>"},
                     {"byte_fallback", true}},
                    {{"decoder", {{"type", "ByteFallback"}}}});
  EXPECT_EQ(Encode(*tok, "a\xC3\xA9"), Ids(*tok, {"a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(*tok->Decode(Encode(*tok, "a\xC3\xA9"), false), "a\xC3\xA9");
  // An incomplete character decodes to one U+FFFD per byte.
  EXPECT_EQ(*tok->Decode(Ids(*tok, {"<0xC3>", "a"}), false),
            "\xEF\xBF\xBD"
            "a");
}

TEST(TokenizerTest, SubwordPrefixAndWordSuffix) {
  auto prefixed = Inline({{"vocab", {{"a", 0}, {"##b", 1}, {"ab", 2}, {"b", 3}}},
                          {"merges", {"a ##b"}},
                          {"continuing_subword_prefix", "##"}});
  EXPECT_EQ(Encode(*prefixed, "ab"), Ids(*prefixed, {"ab"}));
  EXPECT_EQ(Encode(*prefixed, "bb"), Ids(*prefixed, {"b", "##b"}));
  auto suffixed = Inline({{"vocab", {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}}},
                          {"merges", {"a b</w>"}},
                          {"end_of_word_suffix", "</w>"}},
                         {{"decoder", {{"type", "BPEDecoder"}, {"suffix", "</w>"}}}});
  EXPECT_EQ(Encode(*suffixed, "ab"), Ids(*suffixed, {"ab</w>"}));
  EXPECT_EQ(*suffixed->Decode(Ids(*suffixed, {"ab</w>", "ab</w>"}), false), "ab ab");
}

// Model over single characters so that every character is visible in the ids.
const nlohmann::json kCharModel = {
    {"vocab", {{"a", 0}, {"b", 1}, {" ", 2}, {"<", 3}, {"x", 4}, {">", 5}}},
    {"merges", nlohmann::json::array()}};

nlohmann::json AddedX(bool lstrip, bool rstrip, bool single_word) {
  return {{{"id", 6},
           {"content", "<x>"},
           {"special", true},
           {"lstrip", lstrip},
           {"rstrip", rstrip},
           {"single_word", single_word},
           {"normalized", false}}};
}

TEST(TokenizerTest, AddedTokenStripFlags) {
  auto plain = Inline(kCharModel, {{"added_tokens", AddedX(false, false, false)}});
  EXPECT_EQ(Encode(*plain, "a <x> b"), Ids(*plain, {"a", " ", "<x>", " ", "b"}));
  auto left = Inline(kCharModel, {{"added_tokens", AddedX(true, false, false)}});
  EXPECT_EQ(Encode(*left, "a  <x> b"), Ids(*left, {"a", "<x>", " ", "b"}));
  auto right = Inline(kCharModel, {{"added_tokens", AddedX(false, true, false)}});
  EXPECT_EQ(Encode(*right, "a <x>  b"), Ids(*right, {"a", " ", "<x>", "b"}));
  auto word = Inline(kCharModel, {{"added_tokens", AddedX(false, false, true)}});
  EXPECT_EQ(Encode(*word, "a<x> b"), Ids(*word, {"a", "<", "x", ">", " ", "b"}));
  EXPECT_EQ(Encode(*word, "a <x> b"), Ids(*word, {"a", " ", "<x>", " ", "b"}));
}

TEST(TokenizerTest, SpecialTokensAsText) {
  auto tok = Inline(kCharModel, {{"added_tokens", AddedX(false, false, false)}});
  auto ids = tok->Encode("a<x>", false, /*parse_special_tokens=*/false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Ids(*tok, {"a", "<", "x", ">"}));
  EXPECT_TRUE(tok->IsSpecial(*tok->TokenToId("<x>")));
  EXPECT_FALSE(tok->IsSpecial(*tok->TokenToId("a")));
}

TEST(TokenizerTest, NormalizedAddedTokenMatchesAfterNormalization) {
  nlohmann::json added = AddedX(false, false, false);
  added[0]["content"] = "<X>";
  added[0]["normalized"] = true;
  auto tok = Inline(kCharModel, {{"added_tokens", added}, {"normalizer", {{"type", "Lowercase"}}}});
  EXPECT_EQ(Encode(*tok, "A<X>"), Ids(*tok, {"a", "<X>"}));
  EXPECT_EQ(Encode(*tok, "A<x>"), Ids(*tok, {"a", "<X>"}));
}

TEST(TokenizerTest, InvalidUtf8IsRejected) {
  auto llama3 = Load("llama3");
  auto llama2 = Load("llama2");
  for (const char* bad :
       {"\xFF", "abc\xC3", "\xED\xA0\x80", "\xC0\xAF", "ok\xF4\x90\x80\x80", "\xE2\x82"}) {
    for (const Tokenizer* tok : {llama3.get(), llama2.get()}) {
      const auto ids = tok->Encode(bad, true);
      ASSERT_FALSE(ids.ok());
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(ids.status().message()), HasSubstr("UTF-8"));
    }
  }
}

TEST(TokenizerTest, DecodeRejectsIdsOutsideTheVocab) {
  auto tok = Load("gpt2");
  for (int32_t id : {-1, tok->vocab_size(), 1 << 30}) {
    const std::vector<int32_t> ids = {15, id};
    const auto text = tok->Decode(ids, false);
    ASSERT_FALSE(text.ok()) << id;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  }
  StreamDecoder stream(*tok, false);
  EXPECT_FALSE(stream.StepOrError(-5).ok());
  EXPECT_FALSE(stream.Step(tok->vocab_size()).has_value());
  // A rejected id leaves the stream as it was.
  const auto hello = tok->Encode("Hello", false);
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(stream.Step((*hello)[0]), std::optional<std::string>("Hello"));
}

TEST(TokenizerTest, MissingFileIsNotFound) {
  const std::string path = DataPath("no_such_dir/tokenizer.json");
  const auto tok = Tokenizer::FromFile(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(path));
  EXPECT_FALSE(Tokenizer::FromModelDir(DataPath("no_such_dir")).ok());
}

TEST(TokenizerTest, BadJsonNamesTheOrigin) {
  const auto broken = Tokenizer::FromJsonText("{\"model\": {", "broken.json");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("broken.json"));

  const auto wrong_type =
      Tokenizer::FromJsonText(R"({"model": {"vocab": [1, 2], "merges": []}})", "wrong.json");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_THAT(std::string(wrong_type.status().message()), HasSubstr("wrong.json"));

  const auto bad_merge =
      Tokenizer::FromJsonText(R"({"model": {"vocab": {"a": 0}, "merges": ["a q"]}})", "merge.json");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_THAT(std::string(bad_merge.status().message()), HasSubstr("merge.json"));

  const auto unigram =
      Tokenizer::FromJsonText(R"({"model": {"type": "Unigram", "vocab": []}})", "unigram.json");
  ASSERT_FALSE(unigram.ok());
  EXPECT_EQ(unigram.status().code(), absl::StatusCode::kUnimplemented);

  const auto bad_regex = Tokenizer::FromJsonText(
      R"({"model": {"vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})",
      "regex.json");
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_THAT(std::string(bad_regex.status().message()), HasSubstr("regex.json"));

  const auto not_object = Tokenizer::FromJsonText("[1, 2]", "array.json");
  EXPECT_FALSE(not_object.ok());
}

TEST(TokenizerTest, ModelDirConfig) {
  auto qwen = Load("qwen3");
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_EQ(qwen->eos_id(), qwen->TokenToId("<|im_end|>"));
  EXPECT_EQ(qwen->add_bos_token(), std::optional<bool>(false));
  EXPECT_THAT(qwen->chat_template(), HasSubstr("<|im_start|>"));
  auto plain = Tokenizer::FromFile(DataPath("qwen3/tokenizer.json"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->eos_id().has_value());
  EXPECT_EQ((*plain)->IdToToken(-3), "");
  EXPECT_EQ((*plain)->IdToToken((*plain)->vocab_size()), "");
}

TEST(TokenizerTest, ConcurrentEncodeMatchesVectors) {
  auto tok = Load("llama3");
  const nlohmann::json vectors = ReadJson(DataPath("llama3/test_vectors.json"));
  std::vector<std::pair<std::string, std::vector<int32_t>>> cases;
  for (const auto& c : vectors.at("cases")) {
    cases.emplace_back(c.at("text").get<std::string>(),
                       c.at("ids_with_special").get<std::vector<int32_t>>());
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < cases.size(); ++i) {
          const auto& [text, expected] = cases[(i + t * 7) % cases.size()];
          const auto ids = tok->Encode(text, true);
          if (!ids.ok() || *ids != expected) ++mismatches[t];
          const auto decoded = tok->Decode(expected, false);
          if (!decoded.ok()) ++mismatches[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

double Millis(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

TEST(TokenizerTest, LoadAndEncodeSpeed) {
  for (const char* name : {"qwen3", "llama3"}) {
    const auto start = std::chrono::steady_clock::now();
    auto tok = Tokenizer::FromFile(DataPath(std::string(name) + "/tokenizer.json"));
    ASSERT_TRUE(tok.ok());
    const double load_ms = Millis(std::chrono::steady_clock::now() - start);
    std::cout << name << ": load " << load_ms << " ms\n";
    EXPECT_LT(load_ms, 10000);  // loose: sanitizer builds are slow; Release is far below 1 s
  }
  for (const char* name : {"llama3", "qwen3", "llama2"}) {
    auto tok = Load(name);
    const nlohmann::json vectors = ReadJson(DataPath(std::string(name) + "/test_vectors.json"));
    std::string prompt;
    size_t tokens = 0;
    while (tokens < 2000) {
      for (const auto& c : vectors.at("cases")) prompt += c.at("text").get<std::string>() + "\n";
      tokens = tok->Encode(prompt, true)->size();
    }
    constexpr int kRounds = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(tok->Encode(prompt, true).ok());
    const double encode_ms = Millis(std::chrono::steady_clock::now() - start) / kRounds;
    std::cout << name << ": encode " << tokens << " tokens (" << prompt.size() << " bytes) in "
              << encode_ms << " ms\n";
    EXPECT_LT(encode_ms, 1000);
  }
}

TEST(TokenizerTest, ConcurrentLoadAndEncode) {
  const std::string dir = tandem::TestSourceDir() + "/models/stories260k";
  const nlohmann::json vectors = ReadJson(dir + "/test_vectors.json");
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        auto tok = Tokenizer::FromModelDir(dir);
        if (!tok.ok()) {
          ++failures[t];
          continue;
        }
        for (const auto& c : vectors.at("cases")) {
          const auto ids = (*tok)->Encode(c.at("text").get<std::string>(), true);
          if (!ids.ok() || *ids != c.at("ids_with_special").get<std::vector<int32_t>>()) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

// Random text: byte-level tokenizers are lossless (Qwen3 up to NFC), and the stream decoder
// emits exactly the decoded text.
TEST(TokenizerTest, RandomTextRoundTrips) {
  std::mt19937 rng(1234);
  const auto random_text = [&rng](const std::vector<std::string>& specials) {
    static const char32_t kRanges[][2] = {
        {0x20, 0x7E},       {0x09, 0x0D},     {0xA0, 0x24F},
        {0x300, 0x36F},     {0x4E00, 0x4E80}, {0xAC00, 0xAC40},
        {0x1F600, 0x1F64F}, {0x2000, 0x206F}, {0x10000, 0x10FFFF}};
    std::string text;
    const int length = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < length; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 19)(rng);
      if (kind == 19 && !specials.empty()) {
        text += specials[std::uniform_int_distribution<size_t>(0, specials.size() - 1)(rng)];
        continue;
      }
      const auto& range = kRanges[kind < 10 ? 0 : kind - 10];
      char32_t cp = std::uniform_int_distribution<char32_t>(range[0], range[1])(rng);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      unicode::AppendUtf8(cp, &text);
    }
    return text;
  };
  for (const char* name : {"gpt2", "llama3", "qwen3", "llama2"}) {
    SCOPED_TRACE(name);
    auto tok = Load(name);
    const std::vector<std::string> specials = {"<|endoftext|>", "<|eot_id|>", "<think>", "<s>"};
    const bool lossless = std::string(name) != "llama2";
    for (int i = 0; i < 300; ++i) {
      const std::string text = random_text(specials);
      const auto ids = tok->Encode(text, false);
      ASSERT_TRUE(ids.ok()) << ids.status();
      const auto decoded = tok->Decode(*ids, false);
      ASSERT_TRUE(decoded.ok());
      if (lossless) {
        EXPECT_EQ(*decoded, std::string(name) == "qwen3" ? unicode::Nfc(text) : text);
      }
      StreamDecoder stream(*tok, false);
      std::string streamed;
      for (int32_t id : *ids) {
        if (auto chunk = stream.Step(id)) streamed += *chunk;
      }
      if (lossless) {
        EXPECT_EQ(streamed, *decoded);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
