#include "common/tokenizer/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Json ReadJson(const std::string& relative) {
  return Json::parse(ReadFile(tandem::TestSourceDir() + "/" + relative));
}

std::string TemplateSource(const Json& c) {
  const std::string name = c["template"].get<std::string>();
  if (name == "inline") return c["source"].get<std::string>();
  if (auto b = BuiltinChatTemplateByName(name)) return std::string(BuiltinChatTemplateSource(*b));
  if (name.rfind("family:", 0) == 0) {  // a published template of a tokenizer not bundled here
    return ReadJson("tests/data/chat_templates/family_templates.json")[name.substr(7)]
        .get<std::string>();
  }
  const std::string prefix = "tokenizer:";
  EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;
  return ReadJson("tests/data/tokenizers/" + name.substr(prefix.size()) +
                  "/tokenizer_config.json")["chat_template"]
      .get<std::string>();
}

// The built-in templates are the ones the reference vectors were rendered from.
TEST(ChatTemplateTest, BuiltinsMatchTheVectorsSources) {
  const Json builtins = ReadJson("tests/data/chat_templates/builtin_templates.json");
  for (const char* name : {"llama-2", "llama-3", "chatml"}) {
    auto which = BuiltinChatTemplateByName(name);
    ASSERT_TRUE(which.has_value()) << name;
    EXPECT_EQ(std::string(BuiltinChatTemplateSource(*which)), builtins[name].get<std::string>())
        << name;
  }
  EXPECT_FALSE(BuiltinChatTemplateByName("vicuna").has_value());
}

// Renderings of Hugging Face's reference (jinja2 the way transformers sets it up), made by
// tests/data/chat_templates/make_vectors.py: real tokenizer_config.json templates, the built-ins
// and expressions of the Jinja subset; failures (raise_exception) must fail here too.
TEST(ChatTemplateTest, MatchesReferenceRenderings) {
  const Json vectors = ReadJson("tests/data/chat_templates/vectors.json");
  ASSERT_GT(vectors["cases"].size(), 80u);
  for (const Json& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto t = ChatTemplate::Parse(TemplateSource(c));
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
}

// Hand-written expectations of the three built-in formats.
TEST(ChatTemplateTest, BuiltinFormatsByHand) {
  const Json messages = Json::parse(R"([{"role": "system", "content": "S"},
      {"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"},
      {"role": "user", "content": "U2"}])");
  struct Case {
    BuiltinChatTemplate which;
    std::string bos, eos, expected;
  } cases[] = {
      {BuiltinChatTemplate::kLlama2, "<s>", "</s>",
       "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]"},
      {BuiltinChatTemplate::kLlama3, "<|begin_of_text|>", "<|eot_id|>",
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {BuiltinChatTemplate::kChatml, "", "",
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
       "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
       "<|im_start|>assistant\n"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::Parse(BuiltinChatTemplateSource(c.which));
    ASSERT_TRUE(t.ok()) << t.status();
    Json vars = {{"messages", messages},
                 {"add_generation_prompt", true},
                 {"bos_token", c.bos},
                 {"eos_token", c.eos}};
    auto out = (*t)->Render(vars);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c.expected);
  }
}

TEST(ChatTemplateTest, SyntaxErrorsAreInvalidArgument) {
  for (const char* bad : {"{% if x %}", "{{ 1 + }}", "{% for %}", "{{ 'unterminated }}",
                          "{% endfor %}", "{{ a | }}", "{% set = 3 %}", "{{ (((( }}"}) {
    auto t = ChatTemplate::Parse(bad);
    EXPECT_FALSE(t.ok()) << bad;
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(ChatTemplateTest, DeepNestingIsRefusedNotACrash) {
  std::string deep(100000, '(');
  EXPECT_FALSE(ChatTemplate::Parse("{{ " + deep + " }}").ok());
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_FALSE(ChatTemplate::Parse(ifs).ok());
}

TEST(ChatTemplateTest, LimitsStopRunawayTemplates) {
  auto loop = ChatTemplate::Parse(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}x"
      "{% endfor %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(loop.ok()) << loop.status();
  auto out = (*loop)->Render(Json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);

  auto blowup = ChatTemplate::Parse(
      "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}"
      "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}");
  ASSERT_TRUE(blowup.ok()) << blowup.status();
  out = (*blowup)->Render(Json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);

  auto recurse = ChatTemplate::Parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(recurse.ok()) << recurse.status();
  EXPECT_FALSE((*recurse)->Render(Json::object()).ok());

  // Sizes taken from the variables (chat_template_kwargs reach them) are bounded before any
  // work: widths near 2^62 (where width * 4 wraps around), fills, precisions, recursion.
  const Json w = Json::parse(R"({"w": 4611686018427387905, "big": 9223372036854775807})");
  for (const char* source :
       {"{{ 'x'.ljust(w) }}", "{{ 'x'.center(w) }}", "{{ 'x' | center(w) }}", "{{ '7'.zfill(w) }}",
        "{{ '%*d' % (w, 1) }}", "{{ '%.*f' % (w, 1.5) }}", "{{ [1] | batch(w, 0) | list }}",
        "{{ 'x' | indent(w) | length }}{{ 'x' * w }}",
        "{% for n in [[[[]]]] recursive %}{{ loop([n, n]) }}{% endfor %}"}) {
    SCOPED_TRACE(source);
    auto t = ChatTemplate::Parse(source);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_FALSE((*t)->Render(w).ok());
  }
  // A truncate length at the top of the range returns the text (no overflow of length + leeway).
  auto truncate = ChatTemplate::Parse("{{ 'hello world' | truncate(big, leeway=big) }}");
  ASSERT_TRUE(truncate.ok()) << truncate.status();
  auto kept = (*truncate)->Render(w);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "hello world");
}

TEST(ChatTemplateTest, ChoosesTheTokenizersTemplateOrABuiltin) {
  auto llama3 = Tokenizer::FromModelDir(tandem::TestSourceDir() + "/tests/data/tokenizers/llama3");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  auto choice = ChooseChatTemplate(**llama3, "");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->origin, "tokenizer_config.json");
  EXPECT_EQ(choice->source,
            ReadJson("tests/data/tokenizers/llama3/tokenizer_config.json")["chat_template"]
                .get<std::string>());

  choice = ChooseChatTemplate(**llama3, "chatml");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->source, std::string(BuiltinChatTemplateSource(BuiltinChatTemplate::kChatml)));
  EXPECT_FALSE(ChooseChatTemplate(**llama3, "/nonexistent/template.jinja").ok());

  // stories260k's tokenizer has no chat_template and no special chat tokens: llama-2.
  auto stories = Tokenizer::FromModelDir(tandem::TestSourceDir() + "/models/stories260k");
  ASSERT_TRUE(stories.ok()) << stories.status();
  choice = ChooseChatTemplate(**stories, "");
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->origin, "built-in llama-2");
}

}  // namespace
}  // namespace tandem
