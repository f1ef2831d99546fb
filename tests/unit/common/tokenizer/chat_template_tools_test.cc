// Tool calling through the chat templates of Llama 3.1, Llama 3.2, Qwen2.5, Qwen3 and Mistral
// v0.3: the `tools` list, assistant `tool_calls` (arguments as objects), `tool` results and
// parallel calls render exactly as Python's jinja2 renders them in transformers' environment
// (tests/data/chat_templates/make_tool_vectors.py writes tool_vectors.json); where the reference
// refuses (Llama's single-call rule) the template must refuse too, with the same message.

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/tokenizer/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Json ReadJson(const std::string& relative) {
  std::ifstream in(tandem::TestSourceDir() + "/" + relative, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

std::string Source(const std::string& name) {
  if (name == "qwen3") {
    return ReadJson("tests/data/tokenizers/qwen3/tokenizer_config.json")["chat_template"];
  }
  return ReadJson("tests/data/chat_templates/tool_templates.json")[name];
}

TEST(ChatTemplateToolsTest, MatchesReferenceRenderings) {
  const Json vectors = ReadJson("tests/data/chat_templates/tool_vectors.json");
  ASSERT_GE(vectors["cases"].size(), 40u);
  std::set<std::string> families;
  for (const Json& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    families.insert(c["template"].get<std::string>());
    auto t = ChatTemplate::Parse(Source(c["template"]));
    ASSERT_TRUE(t.ok()) << t.status();
    auto out = (*t)->Render(c["variables"]);
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << *out;
      EXPECT_NE(std::string(out.status().message()).find(c["error"].get<std::string>()),
                std::string::npos)
          << out.status();
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, c["expected"].get<std::string>());
    }
  }
  EXPECT_EQ(families,
            (std::set<std::string>{"llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "mistral-v0.3"}));
}

}  // namespace
}  // namespace tandem
