#include "common/grammar/json_schema.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grammar/regex_to_grammar.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kBaseRules[] =
    R"(json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ( json-string ":" json-value ( "," json-string ":" json-value )* )? "}"
json-array ::= "[" ( json-value ( "," json-value )* )? "]"
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-int ::= "-"? json-nonneg-int
json-nonneg-int ::= "0" | [1-9] [0-9]{0,15}
json-number ::= json-int json-frac
json-nonneg-number ::= json-nonneg-int json-frac
json-frac ::= ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
)";

// Keywords that only annotate: they never change which documents validate.
const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {
      "$schema",     "$id",     "id",          "$comment",         "title",
      "description", "default", "examples",    "deprecated",       "readOnly",
      "writeOnly",   "$defs",   "definitions", "contentMediaType", "contentEncoding",
      "$anchor",     "strict",  "name"};
  return k;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options)
      : root_(root), options_(options) {}

  absl::StatusOr<std::string> Compile() {
    auto expr = Visit(root_, "#", 0);
    if (!expr.ok()) return expr.status();
    std::string out = absl::StrCat(options_.prefix, "root ::= ", *expr, "\n",
                                   options_.include_base_rules ? kBaseRules : "");
    for (const auto& rule : rules_) absl::StrAppend(&out, rule, "\n");
    return out;
  }

 private:
  // A keyword this compiler cannot honour: refused when strict, ignored (best effort) otherwise.
  bool Refuse() const { return options_.strict; }

  absl::Status Error(const std::string& where, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: at ", where, ": ", std::string(what)));
  }

  std::string NewRule(const std::string& body) {
    std::string name = absl::StrCat(options_.prefix, "s", rule_count_++);
    rules_.push_back(absl::StrCat(name, " ::= ", body));
    return name;
  }

  // oneOf alternatives no document can match twice: each has a single distinct type (integer
  // and number overlap), or each lists const/enum values and no value repeats.
  static bool Disjoint(const Json& alts) {
    std::set<std::string> types, values;
    bool by_type = true, by_value = true;
    for (const Json& a : alts) {
      if (!a.is_object()) return false;
      if (a.contains("type") && a["type"].is_string() && !a.contains("$ref")) {
        by_type = by_type && types.insert(a["type"].get<std::string>()).second;
      } else {
        by_type = false;
      }
      if (a.contains("const")) {
        by_value = by_value && values.insert(a["const"].dump()).second;
      } else if (a.contains("enum") && a["enum"].is_array()) {
        for (const Json& v : a["enum"]) by_value = by_value && values.insert(v.dump()).second;
      } else {
        by_value = false;
      }
    }
    if (types.count("integer") && types.count("number")) by_type = false;
    return by_type || by_value;
  }

  // A grammar literal for a JSON value, serialised compactly.
  std::string ValueLiteral(const Json& v) { return GrammarLiteral(v.dump()); }

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& where, int depth) {
    if (depth > options_.max_depth) return Error(where, "schema nested too deeply");
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Error(where, "the schema 'false' matches nothing");
    }
    if (!s.is_object()) return Error(where, "a schema must be an object or a boolean");
    static const std::set<std::string> kHandled = {"type",         "properties",
                                                   "required",     "additionalProperties",
                                                   "enum",         "const",
                                                   "items",        "prefixItems",
                                                   "minItems",     "maxItems",
                                                   "anyOf",        "oneOf",
                                                   "allOf",        "$ref",
                                                   "minLength",    "maxLength",
                                                   "pattern",      "format",
                                                   "minimum",      "exclusiveMinimum",
                                                   "maximum",      "exclusiveMaximum",
                                                   "uniqueItems",  "minProperties",
                                                   "maxProperties"};
    for (const auto& [key, value] : s.items()) {
      if (!kHandled.count(key) && !Annotations().count(key) && options_.strict) {
        return Error(where, absl::StrCat("keyword '", key, "' is not supported"));
      }
    }
    if (s.contains("$ref")) {
      if (s.size() > 1) {
        for (const auto& [key, value] : s.items()) {
          if (key != "$ref" && !Annotations().count(key)) {
            return Error(where, "$ref beside other validation keywords is not supported");
          }
        }
      }
      return Ref(s["$ref"], where, depth);
    }
    if (s.contains("allOf")) {
      const Json& all = s["allOf"];
      if (!all.is_array() || all.empty()) return Error(where, "allOf must be a non-empty array");
      if (all.size() > 1 || s.size() > 1) {
        return Error(where,
                     "allOf is supported only with a single subschema and nothing beside it");
      }
      return Visit(all[0], where + "/allOf/0", depth + 1);
    }
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!s.contains(kw)) continue;
      const Json& alts = s[kw];
      if (!alts.is_array() || alts.empty())
        return Error(where, absl::StrCat(kw, " must be a non-empty array"));
      for (const auto& [key, value] : s.items()) {
        if (key != kw && !Annotations().count(key)) {
          return Error(where,
                       absl::StrCat(kw, " beside other validation keywords is not supported"));
        }
      }
      if (std::string(kw) == "oneOf" && options_.strict && !Disjoint(alts)) {
        return Error(where,
                     "oneOf whose alternatives may overlap is not supported (exactly one "
                     "must match); use anyOf, or give each alternative its own type or "
                     "const/enum values");
      }
      std::vector<std::string> parts;
      for (size_t i = 0; i < alts.size(); ++i) {
        auto e = Visit(alts[i], absl::StrCat(where, "/", kw, "/", i), depth + 1);
        if (!e.ok()) return e.status();
        parts.push_back(*e);
      }
      return NewRule(absl::StrJoin(parts, " | "));
    }
    if (s.contains("const")) return ValueLiteral(s["const"]);
    if (s.contains("enum")) {
      const Json& values = s["enum"];
      if (!values.is_array() || values.empty())
        return Error(where, "enum must be a non-empty array");
      enum_count_ += static_cast<int64_t>(values.size());
      if (enum_count_ > options_.max_enum) {
        return Error(where, absl::StrCat("more than ", options_.max_enum, " enum values"));
      }
      std::vector<std::string> parts;
      for (const auto& v : values) parts.push_back(ValueLiteral(v));
      return NewRule(absl::StrJoin(parts, " | "));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) return Error(where, "type must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(where, "type must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
               s.contains("maxLength")) {
      types = {"string"};
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types = {"number"};
    } else {
      return std::string("json-value");
    }
    std::vector<std::string> parts;
    for (const std::string& t : types) {
      absl::StatusOr<std::string> e;
      if (t == "object") {
        e = Object(s, where, depth);
      } else if (t == "array") {
        e = Array(s, where, depth);
      } else if (t == "string") {
        e = String(s, where);
      } else if (t == "integer" || t == "number") {
        e = Number(s, where, t == "integer");
      } else if (t == "boolean") {
        e = std::string("( \"true\" | \"false\" )");
      } else if (t == "null") {
        e = std::string("\"null\"");
      } else {
        return Error(where, absl::StrCat("unknown type '", t, "'"));
      }
      if (!e.ok()) return e.status();
      parts.push_back(*e);
    }
    return parts.size() == 1 ? parts[0] : NewRule(absl::StrJoin(parts, " | "));
  }

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& where, int depth) {
    if (!ref.is_string()) return Error(where, "$ref must be a string");
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') {
      return Error(where,
                   absl::StrCat("$ref '", target, "': only local references (#...) are supported"));
    }
    const Json* node = &root_;
    if (target.size() > 1) {
      if (target[1] != '/')
        return Error(where, absl::StrCat("$ref '", target, "': not a JSON pointer"));
      for (absl::string_view piece : absl::StrSplit(target.substr(2), '/')) {
        const std::string part(piece);
        // JSON pointer unescaping: ~1 -> /, ~0 -> ~.
        std::string key;
        for (size_t i = 0; i < part.size(); ++i) {
          if (part[i] == '~' && i + 1 < part.size() && (part[i + 1] == '0' || part[i + 1] == '1')) {
            key.push_back(part[i + 1] == '0' ? '~' : '/');
            ++i;
          } else {
            key.push_back(part[i]);
          }
        }
        if (node->is_object() && node->contains(key)) {
          node = &(*node)[key];
        } else if (node->is_array() && !key.empty() &&
                   std::all_of(key.begin(), key.end(), ::isdigit) &&
                   std::stoul(key) < node->size()) {
          node = &(*node)[std::stoul(key)];
        } else {
          return Error(where, absl::StrCat("$ref '", target, "' does not resolve"));
        }
      }
    }
    // Name the rule first so recursive references resolve to it.
    const std::string name = absl::StrCat(options_.prefix, "s", rule_count_++);
    refs_[target] = name;
    auto body = Visit(*node, target, depth + 1);
    if (!body.ok()) return body.status();
    rules_.push_back(absl::StrCat(name, " ::= ", *body));
    return name;
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& where, int depth) {
    for (const char* kw : {"minProperties", "maxProperties"}) {
      if (s.contains(kw) && Refuse())
        return Error(where, absl::StrCat("keyword '", kw, "' is not supported"));
    }
    std::vector<std::pair<std::string, std::string>> props;  // key literal, value expr
    std::vector<bool> required;
    std::set<std::string> req;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(where, "required must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return Error(where, "required must list strings");
        req.insert(r.get<std::string>());
      }
    }
    std::set<std::string> declared;
    if (s.contains("properties")) {
      const Json& p = s["properties"];
      if (!p.is_object()) return Error(where, "properties must be an object");
      for (const auto& [key, sub] : p.items()) {
        auto e = Visit(sub, absl::StrCat(where, "/properties/", key), depth + 1);
        if (!e.ok()) return e.status();
        props.push_back({GrammarLiteral(Json(key).dump() + ":"), *e});
        required.push_back(req.count(key) > 0);
        declared.insert(key);
      }
    }
    for (const std::string& r : req) {
      if (!declared.count(r)) {
        return Error(where,
                     absl::StrCat("required property '", r, "' has no schema in properties"));
      }
    }
    // Extra keys: any when additionalProperties is true or a schema; none by default (strict,
    // like OpenAI's strict mode and xgrammar).
    std::string extra;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        auto e = Visit(a, where + "/additionalProperties", depth + 1);
        if (!e.ok()) return e.status();
        extra = *e;
      }
    }
    // tail(i, started): properties i.. in order, each optional one may be left out.
    const size_t n = props.size();
    std::vector<std::string> tail_names[2];
    tail_names[0].resize(n + 1);
    tail_names[1].resize(n + 1);
    for (int st = 0; st < 2; ++st) {
      std::string sep = st ? "\",\" " : "";
      if (extra.empty()) {
        tail_names[st][n] = "\"\"";
      } else {
        std::string kv = absl::StrCat("json-string \":\" ", extra);
        tail_names[st][n] = NewRule(absl::StrCat("( ", sep, kv, " ( \",\" ", kv, " )* )?"));
      }
    }
    for (size_t i = n; i-- > 0;) {
      for (int st = 0; st < 2; ++st) {
        std::string sep = st ? "\",\" " : "";
        std::string with =
            absl::StrCat(sep, props[i].first, " ", props[i].second, " ", tail_names[1][i + 1]);
        std::string body = required[i] ? with : absl::StrCat(with, " | ", tail_names[st][i + 1]);
        tail_names[st][i] = NewRule(body);
      }
    }
    return NewRule(absl::StrCat("\"{\" ", tail_names[0][0], " \"}\""));
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& where, int depth) {
    if (s.contains("uniqueItems") &&
        !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()) && Refuse()) {
      return Error(where, "uniqueItems is not supported");
    }
    auto count = [&](const char* kw, int64_t* v) -> absl::Status {
      if (!s.contains(kw)) return absl::OkStatus();
      if (!s[kw].is_number_integer() || s[kw].get<int64_t>() < 0)
        return Error(where, absl::StrCat(kw, " must be a non-negative integer"));
      *v = s[kw].get<int64_t>();
      if (*v > 1000) return Error(where, absl::StrCat(kw, " above 1000 is not supported"));
      return absl::OkStatus();
    };
    int64_t min = 0, max = -1;
    if (auto st = count("minItems", &min); !st.ok()) return st;
    if (auto st = count("maxItems", &max); !st.ok()) return st;
    if (max >= 0 && max < min) return Error(where, "maxItems is below minItems");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return Error(where, "prefixItems must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        auto e = Visit(s["prefixItems"][i], absl::StrCat(where, "/prefixItems/", i), depth + 1);
        if (!e.ok()) return e.status();
        prefix.push_back(*e);
      }
    }
    std::string item = "json-value";
    bool items_allowed = true;
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (it.is_array())
        return Error(where, "items as an array (draft 4 tuples) is not supported; use prefixItems");
      if (it.is_boolean() && !it.get<bool>()) {
        items_allowed = false;
      } else {
        auto e = Visit(it, where + "/items", depth + 1);
        if (!e.ok()) return e.status();
        item = *e;
      }
    }
    if (!prefix.empty()) {
      // Tuple: the prefix items in order (as many as min/max allow), then the rest.
      if (min > static_cast<int64_t>(prefix.size()) && !items_allowed)
        return Error(where, "minItems exceeds the tuple length");
      // Build: "[" then p0 ("," p1 (...)?)? with required ones up to min.
      std::string rest = items_allowed ? NewRule(absl::StrCat("( \",\" ", item, " )*")) : "\"\"";
      if (max >= 0 || min > static_cast<int64_t>(prefix.size())) {
        return Error(where, "prefixItems together with minItems/maxItems is not supported");
      }
      std::string tail = rest;
      for (size_t i = prefix.size(); i-- > 1;) {
        std::string with = absl::StrCat("\",\" ", prefix[i], " ", tail);
        tail = NewRule(static_cast<int64_t>(i) < min ? with : absl::StrCat(with, " | \"\""));
      }
      std::string first = absl::StrCat(prefix[0], " ", tail);
      return NewRule(
          absl::StrCat("\"[\" ", min > 0 ? first : absl::StrCat("( ", first, " )?"), " \"]\""));
    }
    if (!items_allowed) {
      if (min > 0) return Error(where, "minItems > 0 with items: false matches nothing");
      return std::string("\"[]\"");
    }
    std::string more;
    if (max < 0) {
      more = absl::StrCat("( \",\" ", item, " ){", std::max<int64_t>(0, min - 1), ",}");
    } else {
      more = absl::StrCat("( \",\" ", item, " ){", std::max<int64_t>(0, min - 1), ",",
                          std::max<int64_t>(0, max - 1), "}");
    }
    if (max == 0) return std::string("\"[]\"");
    std::string body = absl::StrCat(item, " ", more);
    return NewRule(
        absl::StrCat("\"[\" ", min > 0 ? body : absl::StrCat("( ", body, " )?"), " \"]\""));
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& where) {
    int64_t min = 0, max = -1;
    for (const char* kw : {"minLength", "maxLength"}) {
      if (!s.contains(kw)) continue;
      if (!s[kw].is_number_integer() || s[kw].get<int64_t>() < 0)
        return Error(where, absl::StrCat(kw, " must be a non-negative integer"));
      int64_t v = s[kw].get<int64_t>();
      if (v > 1000) return Error(where, absl::StrCat(kw, " above 1000 is not supported"));
      (std::string(kw) == "minLength" ? min : max) = v;
    }
    if (max >= 0 && max < min) return Error(where, "maxLength is below minLength");
    if (s.contains("pattern")) {
      if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
        return Error(where, "pattern together with minLength/maxLength/format is not supported");
      }
      if (!s["pattern"].is_string()) return Error(where, "pattern must be a string");
      auto e = RegexToGrammarExpr(s["pattern"].get<std::string>(), /*json_string=*/true);
      if (!e.ok()) return Error(where + "/pattern", std::string(e.status().message()));
      return NewRule(absl::StrCat("\"\\\"\" ", *e, " \"\\\"\""));
    }
    if (s.contains("format") && s["format"].is_string()) {
      const std::string f = s["format"].get<std::string>();
      static const std::map<std::string, std::string> kFormats = {
          {"date",
           R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))"},
          {"time",
           R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]+ )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
          {"uuid",
           R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
          {"ipv4",
           R"(( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ( "." ( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ){3})"},
          {"email",
           R"([a-zA-Z0-9_+-]+ ( "." [a-zA-Z0-9_+-]+ )* "@" [a-zA-Z0-9-]+ ( "." [a-zA-Z0-9-]+ )+)"},
      };
      auto it = kFormats.find(f);
      if (f == "date-time") {
        if (s.contains("minLength") || s.contains("maxLength"))
          return Error(where, "format with minLength/maxLength is not supported");
        return NewRule(absl::StrCat("\"\\\"\" ", kFormats.at("date"), " \"T\" ",
                                    kFormats.at("time"), " \"\\\"\""));
      }
      if (it != kFormats.end()) {
        if (s.contains("minLength") || s.contains("maxLength"))
          return Error(where, "format with minLength/maxLength is not supported");
        return NewRule(absl::StrCat("\"\\\"\" ", it->second, " \"\\\"\""));
      }
      // Other formats are annotations here: any string.
    }
    if (min == 0 && max < 0) return std::string("json-string");
    std::string bounds =
        max < 0 ? absl::StrCat("{", min, ",}") : absl::StrCat("{", min, ",", max, "}");
    return NewRule(absl::StrCat("\"\\\"\" json-char", bounds, " \"\\\"\""));
  }

  absl::StatusOr<std::string> Number(const Json& s, const std::string& where, bool integer) {
    // Bounds: only the non-negative / positive lower bounds common in tool schemas.
    bool nonneg = false, positive = false;
    if (!Refuse()) return std::string(integer ? "json-int" : "json-number");
    if (s.contains("maximum") || s.contains("exclusiveMaximum")) {
      return Error(where, "maximum/exclusiveMaximum are not supported");
    }
    if (s.contains("minimum")) {
      const Json& m = s["minimum"];
      if (!m.is_number()) return Error(where, "minimum must be a number");
      const double v = m.get<double>();
      if (v == 0) {
        nonneg = true;
      } else if (v == 1 && integer) {
        positive = true;
      } else {
        return Error(where, "minimum other than 0 (or 1 for integers) is not supported");
      }
    }
    if (s.contains("exclusiveMinimum")) {
      const Json& m = s["exclusiveMinimum"];
      if (!m.is_number() || m.get<double>() != 0 || !integer || s.contains("minimum")) {
        return Error(where, "exclusiveMinimum other than 0 on an integer is not supported");
      }
      positive = true;
    }
    if (positive) return std::string("( [1-9] [0-9]{0,15} )");
    if (integer) return std::string(nonneg ? "json-nonneg-int" : "json-int");
    return std::string(nonneg ? "json-nonneg-number" : "json-number");
  }

  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> refs_;
  int64_t rule_count_ = 0;
  int64_t enum_count_ = 0;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema,
                                                const JsonSchemaOptions& options) {
  Json root = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("json_schema: not valid JSON");
  return SchemaCompiler(root, options).Compile();
}

std::string JsonBaseRules() { return kBaseRules; }

std::string AnyJsonGrammar(bool object_only) {
  return absl::StrCat("root ::= ", object_only ? "json-object" : "json-value", "\n", kBaseRules);
}

}  // namespace tandem::grammar
