#include "common/grammar/json_schema.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/grammar_parser.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

// A byte-per-token vocabulary (printable ASCII plus a few multi-byte pieces).
std::shared_ptr<const TokenVocab> ByteVocab() {
  std::vector<std::string> bytes;
  for (int c = 0x20; c < 0x7F; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  bytes.push_back("\xC3\xA9");
  bytes.push_back("\":");
  bytes.push_back("\",\"");
  return TokenVocab::FromBytes(bytes);
}

bool Matches(const std::string& schema, const std::string& doc) {
  auto text = JsonSchemaToGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return false;
  auto g = ParseGrammar(*text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << *text;
  if (!g.ok()) return false;
  GrammarMatcher m(std::make_shared<CompiledGrammar>(std::move(*g), ByteVocab()));
  return m.AcceptBytes(doc) && m.CanTerminate();
}

// Random documents drawn from the grammar (uniform over allowed tokens; stops when terminated or,
// past a budget, as soon as it can).
std::vector<std::string> Sample(const std::string& schema, int count, uint32_t seed) {
  auto text = JsonSchemaToGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.status();
  auto g = ParseGrammar(*text);
  EXPECT_TRUE(g.ok()) << g.status();
  auto vocab = ByteVocab();
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g), vocab);
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    GrammarMatcher m(compiled);
    std::string doc;
    for (int step = 0; step < 400 && !m.IsTerminated(); ++step) {
      if (step > 60 && m.CanTerminate()) break;
      auto mask = m.NextTokenMask();
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        if (((*mask)[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
      }
      // Prefer closing brackets/quotes past a budget so documents end.
      if (ids.empty()) break;
      int32_t pick = ids[rng() % ids.size()];
      if (step > 30) {
        for (int32_t id : ids) {
          const std::string& b = vocab->bytes(id);
          if (b == "}" || b == "]" || b == "\"") pick = id;
        }
      }
      EXPECT_TRUE(m.AcceptToken(pick));
      doc += vocab->bytes(pick);
    }
    if (m.CanTerminate()) out.push_back(doc);
  }
  return out;
}

const char kPerson[] = R"({"type":"object","properties":{
    "name":{"type":"string"},"age":{"type":"integer","minimum":0},
    "email":{"type":"string","format":"email"},
    "role":{"enum":["admin","user",null,3]},
    "tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3},
    "address":{"$ref":"#/$defs/address"}},
    "required":["name","role"],"additionalProperties":false,
    "$defs":{"address":{"type":"object","properties":{"city":{"type":"string"},
      "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"]}}})";

TEST(JsonSchemaTest, AcceptsValidAndRejectsInvalid) {
  EXPECT_TRUE(Matches(kPerson, R"({"name":"Ann","role":"admin"})"));
  EXPECT_TRUE(Matches(
      kPerson,
      R"({"name":"A","age":3,"role":null,"tags":["ab","c"],"address":{"city":"X","zip":"12345"}})"));
  EXPECT_FALSE(Matches(kPerson, R"({"role":"admin"})"));                // missing name
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","role":"root"})"));      // not in enum
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","role":3,"x":1})"));     // extra key
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","age":-1,"role":3})"));  // minimum 0
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","role":3,"tags":["toolong"]})"));
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","role":3,"tags":["a","b","c","d"]})"));
  EXPECT_FALSE(Matches(kPerson, R"({"name":"A","role":3,"address":{"city":"X","zip":"1234"}})"));
  EXPECT_FALSE(Matches(kPerson, R"({"name": "A","role":3})"));  // compact: no whitespace
}

TEST(JsonSchemaTest, RecursiveRefsUnionsAndTuples) {
  const char tree[] = R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"v":{"type":["integer","null"]},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}}})";
  EXPECT_TRUE(Matches(tree, R"({"v":1,"kids":[{"v":null},{"v":2,"kids":[]}]})"));
  EXPECT_FALSE(Matches(tree, R"({"v":1,"kids":[{"v":"x"}]})"));
  const char tuple[] =
      R"({"type":"array","prefixItems":[{"type":"string"},{"const":1}],"items":false})";
  EXPECT_TRUE(Matches(tuple, R"(["a",1])"));
  EXPECT_TRUE(Matches(tuple, R"(["a"])"));
  EXPECT_FALSE(Matches(tuple, R"(["a",1,2])"));
  const char one_of[] = R"({"oneOf":[{"type":"number"},{"type":"string","minLength":2}]})";
  EXPECT_TRUE(Matches(one_of, "-1.5e3"));
  EXPECT_TRUE(Matches(one_of, "\"ab\""));
  EXPECT_FALSE(Matches(one_of, "\"a\""));
}

TEST(JsonSchemaTest, SampledDocumentsParseAndFollowTheSchema) {
  std::vector<std::string> docs = Sample(kPerson, 30, 3);
  ASSERT_GE(docs.size(), 15u);
  for (const std::string& d : docs) {
    auto j = nlohmann::json::parse(d, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << d;
    ASSERT_TRUE(j.is_object()) << d;
    EXPECT_TRUE(j.contains("name") && j["name"].is_string()) << d;
    EXPECT_TRUE(j.contains("role")) << d;
    if (j.contains("age")) {
      EXPECT_TRUE(j["age"].is_number() && j["age"].get<double>() >= 0 &&
                  d.find("\"age\":-") == std::string::npos)
          << d;
    }
    if (j.contains("tags")) {
      EXPECT_LE(j["tags"].size(), 3u) << d;
    }
  }
}

TEST(JsonSchemaTest, RefusesWhatItCannotHonourNamingTheLocation) {
  auto err = [](const std::string& schema) {
    auto r = JsonSchemaToGrammar(schema);
    EXPECT_FALSE(r.ok()) << schema;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_NE(err(R"({"properties":{"a":{"not":{}}}})").find("#/properties/a"), std::string::npos);
  EXPECT_NE(err(R"({"type":"array","uniqueItems":true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"http://x/y"})").find("local"), std::string::npos);
  EXPECT_NE(err(R"~({"type":"string","pattern":"(?=a)"})~").find("pattern"), std::string::npos);
  err(R"({"type":"strange"})");
  EXPECT_NE(err(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})").find("oneOf"),
            std::string::npos);
  err(R"({"oneOf":[true,true]})");
  err("{not json");
  err(R"({"type":"integer","minimum":6,"maximum":5})");
  err(R"({"type":"number","multipleOf":1.5})");
  err(R"(false)");
  // Recursion bombs and enormous enums are refused by bounds.
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 200; ++i) deep += "}";
  EXPECT_NE(err(deep).find("too deeply"), std::string::npos);
  std::string big = R"({"enum":[)";
  for (int i = 0; i < 20000; ++i) big += (i ? "," : "") + std::to_string(i);
  big += "]}";
  EXPECT_NE(err(big).find("enum"), std::string::npos);
  // A schema whose only derivation never ends matches nothing: refused when parsed.
  auto loop =
      JsonSchemaToGrammar(R"({"$ref":"#/$defs/a","$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"}]}}})");
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_FALSE(ParseGrammar(*loop).ok());
  // Not strict: unsupported validation keywords are ignored.
  JsonSchemaOptions lax;
  lax.strict = false;
  EXPECT_TRUE(
      JsonSchemaToGrammar(R"({"type":"array","uniqueItems":true,"contains":{}})", lax).ok());
}

}  // namespace
}  // namespace tandem::grammar
