#include "common/grammar/json_schema_strings.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grammar/regex_to_grammar.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {

std::optional<std::string> FormatExpr(std::string_view format) {
  // Each a subset of what format validators (ajv-formats' full mode) accept: days per
  // month (never February 29), bounded fractions, labels of letters, digits and inner
  // hyphens.
  static const std::string kLabel = R"([a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )?)";
  static const std::map<std::string, std::string> kFormats = {
      {"date",
       R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))"},
      {"time",
       R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
      {"uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
      {"ipv4",
       R"(( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ( "." ( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ){3})"},
      {"email", absl::StrCat(R"([a-zA-Z0-9_+-]{1,16} ( "." [a-zA-Z0-9_+-]{1,16} ){0,3} "@" )",
                             kLabel, " ( \".\" ", kLabel, " ){1,3}")},
      {"hostname", absl::StrCat(kLabel, " ( \".\" ", kLabel, " ){0,3}")},
  };
  if (format == "date-time") {
    return absl::StrCat(kFormats.at("date"), " \"T\" ", kFormats.at("time"));
  }
  auto it = kFormats.find(std::string(format));
  if (it == kFormats.end()) return std::nullopt;
  return it->second;
}

// The grammar of an object key for additionalProperties: any JSON string except the names in
// `excluded` (declared properties), so an extra key never repeats one. Keys are spelled in
// one way only (no \u or \/ escapes) so that excluding a spelling excludes the name; a trie
// over the names' characters, each node a rule: end here (unless a name ends here), a
// character no name continues with and then anything, or a name's next character.
std::string ExtraKeyGrammar(const std::set<std::string>& excluded,
                            const std::function<std::string(const std::string&)>& new_rule) {
  if (excluded.empty()) return "json-string";
  // Units: one code point, or an escape pair for '"', '\\' and control characters.
  auto units = [](const std::string& name) {
    std::vector<std::string> out;
    const std::string escaped = nlohmann::json(name).dump();  // "..." with JSON escapes
    for (size_t i = 1; i + 1 < escaped.size();) {
      size_t n = 1;
      const unsigned char c = escaped[i];
      if (c == '\\') {
        n = escaped[i + 1] == 'u' ? 6 : 2;
      } else if (c >= 0xF0) {
        n = 4;
      } else if (c >= 0xE0) {
        n = 3;
      } else if (c >= 0xC0) {
        n = 2;
      }
      out.push_back(escaped.substr(i, n));
      i += n;
    }
    return out;
  };
  struct Node {
    bool terminal = false;
    std::map<std::string, int> children;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : excluded) {
    int node = 0;
    for (const std::string& u : units(name)) {
      auto it = trie[node].children.find(u);
      if (it == trie[node].children.end()) {
        trie.push_back({});
        it = trie[node].children.emplace(u, static_cast<int>(trie.size()) - 1).first;
      }
      node = it->second;
    }
    trie[node].terminal = true;
  }
  const std::string rest = new_rule(R"(( [^"\\\x00-\x1F] | "\\" ["\\bfnrt] )* "\"")");
  std::vector<std::string> names(trie.size());
  for (size_t i = trie.size(); i-- > 0;) {
    const Node& n = trie[i];
    std::vector<std::string> alts;
    if (!n.terminal) alts.push_back("\"\\\"\"");
    // A character no excluded name continues with.
    std::string cls = R"([^"\\\x00-\x1F)";
    std::string escapes = "\"\\\\bfnrt";  // letters after a backslash
    for (const auto& [u, child] : n.children) {
      if (u[0] == '\\') {
        escapes.erase(std::remove(escapes.begin(), escapes.end(), u[1]), escapes.end());
        continue;
      }
      uint32_t cp = static_cast<unsigned char>(u[0]);
      if (u.size() == 2) cp = ((cp & 0x1F) << 6) | (u[1] & 0x3F);
      if (u.size() == 3) cp = ((cp & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
      if (u.size() == 4) {
        cp = ((cp & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
      }
      char buf[16];
      snprintf(buf, sizeof buf, "\\U%08X", cp);
      cls += buf;
    }
    cls += "]";
    alts.push_back(absl::StrCat(cls, " ", rest));
    if (!escapes.empty()) {
      std::string esc_cls = "[";
      for (char e : escapes)
        absl::StrAppend(&esc_cls, e == '"' || e == '\\' ? "\\" : "", std::string(1, e));
      alts.push_back(absl::StrCat("\"\\\\\" ", esc_cls, "] ", rest));
    }
    for (const auto& [u, child] : n.children) {
      alts.push_back(absl::StrCat(GrammarLiteral(u), " ", names[child]));
    }
    names[i] = new_rule(absl::StrJoin(alts, " | "));
  }
  return new_rule(absl::StrCat("\"\\\"\" ", names[0]));
}

}  // namespace tandem::grammar
