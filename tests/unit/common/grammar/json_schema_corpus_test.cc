// The JSON Schema front end over a corpus: the hand-written real-world schemas
// (tests/e2e/structured_output/schemas.jsonl) and Debian's json-schema-test-suite (drafts 4, 6,
// 7). Every schema either compiles to a grammar the parser accepts or is refused with
// INVALID_ARGUMENT naming its JSON pointer; every hand-written one compiles; and for each suite
// schema that compiles, no instance the suite marks invalid is accepted by the grammar (the suite
// as an independent oracle of soundness). The end-to-end test samples these grammars and
// validates the output with Ajv.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kSuite[] = "/usr/share/json-schema-test-suite/tests";

std::shared_ptr<const TokenVocab> ByteVocab() {
  static auto* vocab = new std::shared_ptr<const TokenVocab>([] {
    std::vector<std::string> bytes;
    for (int c = 1; c < 256; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
    return TokenVocab::FromBytes(bytes);
  }());
  return *vocab;
}

std::vector<Json> HandWritten() {
  std::ifstream in(tandem::TestSourceDir() + "/tests/e2e/structured_output/schemas.jsonl");
  std::vector<Json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    out.push_back(Json::parse(line));
  }
  return out;
}

struct SuiteGroup {
  std::string name;
  Json schema;
  Json tests;
};

std::vector<SuiteGroup> Suite() {
  std::vector<SuiteGroup> out;
  std::set<std::string> seen;
  for (const char* draft : {"draft7", "draft6", "draft4"}) {
    const std::filesystem::path dir = std::filesystem::path(kSuite) / draft;
    if (!std::filesystem::exists(dir)) continue;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      for (const Json& group : Json::parse(in)) {
        // Same dedup key as the e2e test (sorted keys).
        if (!seen.insert(nlohmann::json::parse(group["schema"].dump()).dump()).second) continue;
        out.push_back({std::string(draft) + "/" + f.filename().string() + ": " +
                           group["description"].get<std::string>(),
                       group["schema"], group["tests"]});
      }
    }
  }
  return out;
}

// Compiles `schema`; nullptr with `error` set when refused.
std::shared_ptr<CompiledGrammar> Compile(const Json& schema, std::string* error) {
  auto text = JsonSchemaToGrammar(schema.dump());
  if (!text.ok()) {
    *error = std::string(text.status().message());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
    return nullptr;
  }
  auto g = ParseGrammar(*text);
  if (!g.ok()) {
    *error = std::string(g.status().message());
    ADD_FAILURE() << "the schema compiler wrote a grammar the parser refuses: " << g.status()
                  << "\nschema: " << schema.dump() << "\n"
                  << text->substr(0, 2000);
    return nullptr;
  }
  return std::make_shared<CompiledGrammar>(std::move(*g), ByteVocab());
}

bool Accepts(const std::shared_ptr<CompiledGrammar>& g, const std::string& doc) {
  GrammarMatcher m(g);
  return m.AcceptBytes(doc) && m.CanTerminate();
}

TEST(JsonSchemaCorpusTest, HandWrittenSchemasAllCompile) {
  const std::vector<Json> corpus = HandWritten();
  ASSERT_GE(corpus.size(), 100u);
  std::set<std::string> names;
  for (const Json& c : corpus) {
    EXPECT_TRUE(names.insert(c["name"].get<std::string>()).second) << c["name"];
    std::string error;
    auto g = Compile(c["schema"], &error);
    EXPECT_NE(g, nullptr) << c["name"] << ": " << error;
    // Each entry may carry example documents: "valid" ones (in compact form, keys in schema
    // order) must be accepted, "invalid" ones refused.
    if (g == nullptr) continue;
    for (const Json& doc : c.value("valid", Json::array())) {
      EXPECT_TRUE(Accepts(g, doc.dump())) << c["name"] << " refuses " << doc.dump();
    }
    for (const Json& doc : c.value("invalid", Json::array())) {
      EXPECT_FALSE(Accepts(g, doc.dump())) << c["name"] << " accepts " << doc.dump();
    }
  }
}

TEST(JsonSchemaCorpusTest, SuiteCompilesOrRefusesNamingTheLocation) {
  const std::vector<SuiteGroup> suite = Suite();
  if (suite.empty()) GTEST_SKIP() << kSuite << " is missing (scripts/setup.sh installs it)";
  int compiled = 0, invalid_checked = 0, valid_accepted = 0, valid_total = 0;
  std::map<std::string, int> refusals;
  for (const SuiteGroup& group : suite) {
    std::string error;
    auto g = Compile(group.schema, &error);
    if (g == nullptr) {
      EXPECT_NE(error.find("at #"), std::string::npos) << group.name << ": " << error;
      ++refusals[error];
      continue;
    }
    ++compiled;
    for (const Json& test : group.tests) {
      const std::string doc = test["data"].dump();
      if (test["valid"].get<bool>()) {
        ++valid_total;
        valid_accepted += Accepts(g, doc);
      } else {
        ++invalid_checked;
        EXPECT_FALSE(Accepts(g, doc))
            << group.name << ": the grammar accepts the invalid instance " << doc << " ("
            << test["description"].get<std::string>() << ")";
      }
    }
  }
  std::cout << "json-schema-test-suite: " << suite.size() << " schemas, " << compiled
            << " compile; " << invalid_checked << " invalid instances refused; " << valid_accepted
            << " of " << valid_total << " valid instances accepted\n";
  for (const auto& [message, count] : refusals)
    std::cout << "  " << count << "x " << message << "\n";
  EXPECT_GE(compiled, 85);
}

// Keys made for additionalProperties never repeat a declared (or required) name, whatever its
// characters, so a parser keeping the last duplicate cannot see a value of the wrong schema.
TEST(JsonSchemaCorpusTest, ExtraKeysNeverRepeatADeclaredName) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {"id": {"type": "integer"},
      "a\"b": {"type": "integer"}, "é": {"type": "integer"}, "gone": false},
      "required": ["id", "tok"], "additionalProperties": {"type": "string"}})");
  std::string error;
  auto g = Compile(schema, &error);
  ASSERT_NE(g, nullptr) << error;
  for (const char* ok :
       {R"({"id":1,"tok":"t"})", R"({"id":1,"tok":"t","idx":"a"})", R"({"id":1,"tok":"t","i":"a"})",
        R"({"id":1,"tok":"t","":"a"})", R"({"id":1,"tok":"t","a\"c":"a"})",
        R"({"id":1,"tok":"t","éé":"a"})", R"({"id":1,"tok":"t","tok2":"a","x\n":"b"})"}) {
    EXPECT_TRUE(Accepts(g, ok)) << ok;
  }
  for (const char* bad : {R"({"id":1,"tok":"t","id":"a"})", R"({"id":1,"tok":"t","tok":"a"})",
                          R"({"id":1,"tok":"t","a\"b":"a"})", R"({"id":1,"tok":"t","é":"a"})",
                          R"({"id":1,"tok":"t","gone":"a"})", R"({"id":1,"tok":"t","\u0069d":"a"})",
                          R"({"id":1,"tok":"t","i\/d":"a"})"}) {
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  }
}

// Recursion bombs and enormous enums (the fuzz seeds tests/fuzz/grammar/corpus/
// json_schema_fuzzer/bomb-*) are refused by a bound with a message saying which.
TEST(JsonSchemaCorpusTest, HostileSchemasGetAClearError) {
  const std::string dir =
      tandem::TestSourceDir() + "/tests/fuzz/grammar/corpus/json_schema_fuzzer/";
  const std::pair<const char*, const char*> cases[] = {
      {"bomb-allof-cycle", "nested too deeply"},  {"bomb-ref-sibling-cycle", "nested too deeply"},
      {"bomb-deep-nesting", "nested too deeply"}, {"bomb-enum", "more than 10000 enum values"},
      {"bomb-anyof-exponential", "expand"},
  };
  for (const auto& [file, message] : cases) {
    std::ifstream in(dir + file, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string schema = bytes.str().substr(1);  // byte 0: the fuzzer's strict flag
    ASSERT_FALSE(schema.empty()) << file;
    auto r = JsonSchemaToGrammar(schema);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << file;
    EXPECT_NE(std::string(r.status().message()).find(message), std::string::npos)
        << file << ": " << r.status();
  }
}

}  // namespace
}  // namespace tandem::grammar
