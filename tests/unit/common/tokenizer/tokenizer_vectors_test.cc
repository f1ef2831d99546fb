// Checks the tokenizer against the Hugging Face test vectors copied into tests/data.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

struct VectorFile {
  const char* name;
  const char* model_dir;  // relative to the repo root: tokenizer.json (+ tokenizer_config.json)
  const char* vectors;    // relative to the repo root
};

const VectorFile kFiles[] = {
    {"llama2", "tests/data/tokenizers/llama2", "tests/data/tokenizers/llama2/test_vectors.json"},
    {"gpt2", "tests/data/tokenizers/gpt2", "tests/data/tokenizers/gpt2/test_vectors.json"},
    {"qwen3", "tests/data/tokenizers/qwen3", "tests/data/tokenizers/qwen3/test_vectors.json"},
    {"llama3", "tests/data/tokenizers/llama3", "tests/data/tokenizers/llama3/test_vectors.json"},
    {"stories260k", "models/stories260k", "models/stories260k/test_vectors.json"},
    // Byte-identical tokenizer.json, so the stories260k vectors hold for it too.
    {"llama2xs_280k", "models/llama2xs-280k", "models/stories260k/test_vectors.json"},
};

std::string Path(const char* relative) { return tandem::TestSourceDir() + "/" + relative; }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::vector<int32_t> Ids(const nlohmann::json& json) { return json.get<std::vector<int32_t>>(); }

class TokenizerVectorsTest : public ::testing::TestWithParam<VectorFile> {
 protected:
  static void SetUpTestSuite() {}
  void SetUp() override {
    const VectorFile& file = GetParam();
    auto tokenizer = Tokenizer::FromModelDir(Path(file.model_dir));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value();
    vectors_ = ReadJson(Path(file.vectors));
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  nlohmann::json vectors_;
};

TEST_P(TokenizerVectorsTest, Header) {
  EXPECT_EQ(tokenizer_->vocab_size(), vectors_.at("vocab_size_with_added").get<int32_t>());
  for (const char* key : {"bos_token", "eos_token"}) {
    const auto id = key[0] == 'b' ? tokenizer_->bos_id() : tokenizer_->eos_id();
    if (vectors_.at(key).is_null()) {
      EXPECT_FALSE(id.has_value()) << key;
    } else {
      ASSERT_TRUE(id.has_value()) << key;
      EXPECT_EQ(tokenizer_->IdToToken(*id), vectors_.at(key).get<std::string>());
      EXPECT_EQ(tokenizer_->TokenToId(vectors_.at(key).get<std::string>()), id);
    }
  }
  for (const auto& added : vectors_.at("added_tokens_first")) {
    const int32_t id = added.at("id").get<int32_t>();
    EXPECT_EQ(tokenizer_->IdToToken(id), added.at("content").get<std::string>());
    EXPECT_EQ(tokenizer_->IsSpecial(id), added.at("special").get<bool>()) << id;
  }
}

TEST_P(TokenizerVectorsTest, Cases) {
  int checked = 0;
  for (const auto& c : vectors_.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE("case " + name);
    const std::string text = c.at("text").get<std::string>();

    const auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(c.at("ids")));
    const auto tokens = c.at("tokens").get<std::vector<std::string>>();
    ASSERT_EQ(tokens.size(), Ids(c.at("ids")).size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(tokenizer_->IdToToken(Ids(c.at("ids"))[i]), tokens[i]);
    }

    const auto ids_with_special = tokenizer_->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids_with_special.ok()) << ids_with_special.status();
    EXPECT_EQ(*ids_with_special, Ids(c.at("ids_with_special")));

    const auto decoded = tokenizer_->Decode(Ids(c.at("ids")), /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c.at("decoded").get<std::string>());

    const auto decoded_special = tokenizer_->Decode(Ids(c.at("ids_with_special")), false);
    ASSERT_TRUE(decoded_special.ok());
    EXPECT_EQ(*decoded_special, c.at("decoded_with_special").get<std::string>());

    const auto decoded_skip = tokenizer_->Decode(Ids(c.at("ids_with_special")), true);
    ASSERT_TRUE(decoded_skip.ok());
    EXPECT_EQ(*decoded_skip, c.at("decoded_with_special_skip").get<std::string>());

    if (c.contains("ids_special_as_text")) {
      const auto as_text = tokenizer_->Encode(text, /*add_special_tokens=*/false,
                                              /*parse_special_tokens=*/false);
      ASSERT_TRUE(as_text.ok());
      EXPECT_EQ(*as_text, Ids(c.at("ids_special_as_text")));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 76);
}

TEST_P(TokenizerVectorsTest, Streams) {
  int checked = 0;
  for (const auto& s : vectors_.at("streams")) {
    const std::string name = s.at("name").get<std::string>();
    SCOPED_TRACE("stream " + name);
    const std::vector<int32_t> ids = Ids(s.at("ids"));
    const bool skip = s.at("skip_special_tokens").get<bool>();
    if (!s.at("text").is_null()) {
      const auto encoded =
          tokenizer_->Encode(s.at("text").get<std::string>(), s.at("add_special_tokens"));
      ASSERT_TRUE(encoded.ok());
      EXPECT_EQ(*encoded, ids);
    }
    StreamDecoder stream(*tokenizer_, skip);
    std::string concat;
    const auto& emitted = s.at("emitted");
    const auto& prefix_text = s.at("prefix_text");
    ASSERT_EQ(emitted.size(), ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      const auto chunk = stream.StepOrError(ids[k]);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      if (emitted[k].is_null()) {
        EXPECT_FALSE(chunk->has_value()) << "k=" << k << " got '" << **chunk << "'";
      } else {
        ASSERT_TRUE(chunk->has_value()) << "k=" << k;
        EXPECT_EQ(**chunk, emitted[k].get<std::string>()) << "k=" << k;
        concat += **chunk;
      }
      const auto prefix = tokenizer_->Decode(absl::MakeConstSpan(ids).subspan(0, k + 1), skip);
      ASSERT_TRUE(prefix.ok());
      EXPECT_EQ(*prefix, prefix_text[k].get<std::string>()) << "k=" << k;
    }
    EXPECT_EQ(concat, s.at("emitted_concat").get<std::string>());
    const auto final_text = tokenizer_->Decode(ids, skip);
    ASSERT_TRUE(final_text.ok());
    EXPECT_EQ(*final_text, s.at("final_text").get<std::string>());
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(AllVectorFiles, TokenizerVectorsTest, ::testing::ValuesIn(kFiles),
                         [](const ::testing::TestParamInfo<VectorFile>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace tandem
