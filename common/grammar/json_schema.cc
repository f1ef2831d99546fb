#include "common/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grammar/json_schema_error.h"
#include "common/grammar/json_schema_merge.h"
#include "common/grammar/json_schema_numbers.h"
#include "common/grammar/json_schema_refs.h"
#include "common/grammar/json_schema_rewrite.h"
#include "common/grammar/json_schema_strings.h"
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
    return SchemaError(where, what);
  }

  std::string NewRule(const std::string& body) {
    std::string name = absl::StrCat(options_.prefix, "s", rule_count_++);
    rules_.push_back(absl::StrCat(name, " ::= ", body));
    return name;
  }

  // A grammar literal for a JSON value, serialised compactly.
  std::string ValueLiteral(const Json& v) { return GrammarLiteral(v.dump()); }

  static bool HasValidation(const Json& s, std::string_view except) {
    return HasValidationKeywords(s, except);
  }
  static std::optional<bool> Fits(const Json& v, const Json& s) { return ValueFits(v, s); }
  std::string ExtraKey(const std::set<std::string>& excluded) {
    return ExtraKeyGrammar(excluded, [this](const std::string& body) { return NewRule(body); });
  }

  static Json Without(const Json& s, const char* key) {
    Json rest = s;
    rest.erase(key);
    return rest;
  }

  // allOf parts and $ref targets beside other keywords, flattened into the list of schemas to
  // merge (json_schema_merge.h).
  absl::Status Flatten(const Json& s, const std::string& where, int depth,
                       std::vector<Json>* parts) {
    if (depth > options_.max_depth) {
      return Error(where, "allOf/$ref nested too deeply (a reference cycle through allOf?)");
    }
    if (++flatten_steps_ > 10000) return Error(where, "allOf/$ref expand to too many parts");
    if (!s.is_object()) {
      parts->push_back(s);
      return absl::OkStatus();
    }
    if (s.contains("$ref")) {
      const Json& ref = s["$ref"];
      if (!ref.is_string()) return Error(where, "$ref must be a string");
      const Json* target = ResolveLocalRef(root_, ref.get<std::string>());
      if (target == nullptr) {
        return Error(where, absl::StrCat("$ref '", ref.get<std::string>(),
                                         "' does not resolve (only local references #... are "
                                         "supported)"));
      }
      if (auto st = Flatten(*target, ref.get<std::string>(), depth + 1, parts); !st.ok()) return st;
      return Flatten(Without(s, "$ref"), where, depth + 1, parts);
    }
    if (s.contains("allOf")) {
      const Json& all = s["allOf"];
      if (!all.is_array() || all.empty()) return Error(where, "allOf must be a non-empty array");
      for (size_t i = 0; i < all.size(); ++i) {
        auto st = Flatten(all[i], absl::StrCat(where, "/allOf/", i), depth + 1, parts);
        if (!st.ok()) return st;
      }
      return Flatten(Without(s, "allOf"), where, depth + 1, parts);
    }
    if (HasValidation(s, "")) parts->push_back(s);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& where, int depth) {
    if (depth > options_.max_depth) return Error(where, "schema nested too deeply");
    if (options_.budget != nullptr) {
      if (auto st = options_.budget->Check(); !st.ok()) return st;
    }
    if (++visits_ > options_.max_subschemas) {
      // Distributing anyOf/oneOf over their siblings and merging allOf can multiply subschemas.
      return Error(where, absl::StrCat("the schema expands to more than ", options_.max_subschemas,
                                       " subschemas"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Error(where, "the schema 'false' matches nothing");
    }
    if (!s.is_object()) return Error(where, "a schema must be an object or a boolean");
    static const std::set<std::string> kHandled = {"type",
                                                   "properties",
                                                   "required",
                                                   "additionalProperties",
                                                   "enum",
                                                   "const",
                                                   "items",
                                                   "prefixItems",
                                                   "minItems",
                                                   "maxItems",
                                                   "anyOf",
                                                   "oneOf",
                                                   "allOf",
                                                   "$ref",
                                                   "minLength",
                                                   "maxLength",
                                                   "pattern",
                                                   "format",
                                                   "minimum",
                                                   "exclusiveMinimum",
                                                   "maximum",
                                                   "exclusiveMaximum",
                                                   "uniqueItems",
                                                   "minProperties",
                                                   "maxProperties",
                                                   "additionalItems",
                                                   "contains",
                                                   "nullable",
                                                   "multipleOf",
                                                   "if",
                                                   "then",
                                                   "else",
                                                   "not",
                                                   "dependencies",
                                                   "dependentRequired",
                                                   "dependentSchemas",
                                                   "patternProperties",
                                                   "propertyNames"};
    for (const auto& [key, value] : s.items()) {
      if (!kHandled.count(key) && !SchemaAnnotations().count(key) && options_.strict) {
        return Error(where, absl::StrCat("keyword '", key, "' is not supported"));
      }
    }
    {
      auto rewritten = RewriteNarrowing(s, where, options_.strict);
      if (!rewritten.ok()) return rewritten.status();
      if (rewritten->has_value()) return Visit(**rewritten, where, depth + 1);
    }
    if (s.contains("$ref") && !HasValidation(s, "$ref")) return Ref(s["$ref"], where, depth);
    if (s.contains("$ref") || s.contains("allOf")) {
      std::vector<Json> parts;
      if (auto st = Flatten(s, where, depth, &parts); !st.ok()) return st;
      if (parts.empty()) return std::string("json-value");
      if (parts.size() == 1) return Visit(parts[0], where, depth + 1);
      auto merged = MergeSchemas(parts, where);
      if (!merged.ok()) return merged.status();
      return Visit(*merged, where, depth + 1);
    }
    if (s.contains("nullable") && s["nullable"] == Json(true)) {
      // OpenAPI's nullable: the schema or null.
      auto e = Visit(Without(s, "nullable"), where, depth + 1);
      if (!e.ok()) return e.status();
      return NewRule(absl::StrCat("\"null\" | ", *e));
    }
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!s.contains(kw)) continue;
      const Json& alts = s[kw];
      if (!alts.is_array() || alts.empty())
        return Error(where, absl::StrCat(kw, " must be a non-empty array"));
      if (std::string(kw) == "oneOf" && options_.strict && !OneOfDisjoint(root_, alts)) {
        return Error(where,
                     "oneOf whose alternatives may overlap is not supported (exactly one "
                     "must match); use anyOf, or give each alternative its own type or "
                     "const/enum values");
      }
      // Keywords beside the alternatives apply to each of them: distributed as allOf.
      const bool distribute = HasValidation(s, kw);
      const Json rest = Without(s, kw);
      std::vector<std::string> parts;
      for (size_t i = 0; i < alts.size(); ++i) {
        if (alts[i].is_boolean() && !alts[i].get<bool>()) continue;  // matches nothing
        const Json alt = distribute ? Json{{"allOf", Json::array({rest, alts[i]})}} : alts[i];
        auto e = Visit(alt, absl::StrCat(where, "/", kw, "/", i), depth + 1);
        if (!e.ok()) return e.status();
        parts.push_back(*e);
      }
      if (parts.empty()) return Error(where, absl::StrCat(kw, ": no alternative can match"));
      return NewRule(absl::StrJoin(parts, " | "));
    }
    if (s.contains("const") || s.contains("enum")) return Values(s, where);
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
      // integer is a subset of number: a list with both is number.
      if (std::count(types.begin(), types.end(), "number")) {
        types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required") || s.contains("minProperties") ||
               s.contains("maxProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems") || s.contains("contains") || s.contains("additionalItems") ||
               s.contains("uniqueItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
               s.contains("maxLength")) {
      types = {"string"};
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum") || s.contains("multipleOf")) {
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
    const Json* node = ResolveLocalRef(root_, target);
    if (node == nullptr) return Error(where, absl::StrCat("$ref '", target, "' does not resolve"));
    // Name the rule first so recursive references resolve to it.
    const std::string name = absl::StrCat(options_.prefix, "s", rule_count_++);
    refs_[target] = name;
    auto body = Visit(*node, target, depth + 1);
    if (!body.ok()) return body.status();
    rules_.push_back(absl::StrCat(name, " ::= ", *body));
    return name;
  }

  // const / enum: the listed values that also satisfy the keywords beside them.
  absl::StatusOr<std::string> Values(const Json& s, const std::string& where) {
    Json values = Json::array();
    if (s.contains("const")) {
      values.push_back(s["const"]);
      if (s.contains("enum")) {
        const Json& e = s["enum"];
        if (!e.is_array() || std::find(e.begin(), e.end(), s["const"]) == e.end()) values.clear();
      }
    } else {
      values = s["enum"];
      if (!values.is_array() || values.empty())
        return Error(where, "enum must be a non-empty array");
    }
    enum_count_ += static_cast<int64_t>(values.size());
    if (enum_count_ > options_.max_enum) {
      return Error(where, absl::StrCat("more than ", options_.max_enum, " enum values"));
    }
    std::vector<std::string> parts;
    for (const Json& v : values) {
      auto fits = Fits(v, s);
      if (!fits.has_value()) {
        if (Refuse()) {
          return Error(where,
                       "enum/const beside keywords other than type, numeric and length bounds "
                       "is not supported");
        }
        fits = true;
      }
      if (*fits) parts.push_back(ValueLiteral(v));
    }
    if (parts.empty()) return Error(where, "no enum/const value satisfies the keywords beside it");
    return parts.size() == 1 ? parts[0] : NewRule(absl::StrJoin(parts, " | "));
  }

  // A non-negative integer keyword (at most 1000), -1 when absent.
  absl::Status Count(const Json& s, const char* kw, const std::string& where, int64_t* v) {
    *v = -1;
    if (!s.contains(kw)) return absl::OkStatus();
    const Json& x = s[kw];
    const bool integral = x.is_number_integer() ||
                          (x.is_number_float() && x.get<double>() == std::floor(x.get<double>()));
    if (!integral || x.get<double>() < 0)
      return Error(where, absl::StrCat(kw, " must be a non-negative integer"));
    if (x.get<double>() > 1000)
      return Error(where, absl::StrCat(kw, " above 1000 is not supported"));
    *v = static_cast<int64_t>(x.get<double>());
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& where, int depth) {
    int64_t min_props, max_props;
    if (auto st = Count(s, "minProperties", where, &min_props); !st.ok()) return st;
    if (auto st = Count(s, "maxProperties", where, &max_props); !st.ok()) return st;
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
        declared.insert(key);
        if (sub.is_boolean() && !sub.get<bool>()) {
          // A property whose schema is false must be absent.
          if (req.count(key))
            return Error(where, absl::StrCat("required property '", key, "' has schema false"));
          continue;
        }
        auto e = Visit(sub, absl::StrCat(where, "/properties/", key), depth + 1);
        if (!e.ok()) return e.status();
        props.push_back({GrammarLiteral(Json(key).dump() + ":"), *e});
        required.push_back(req.count(key) > 0);
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
    for (const std::string& r : req) {
      if (!declared.count(r)) {
        if (extra.empty()) {
          return Error(where,
                       absl::StrCat("required property '", r, "' has no schema in properties"));
        }
        // Required but undeclared: its value follows additionalProperties.
        props.push_back({GrammarLiteral(Json(r).dump() + ":"), extra});
        required.push_back(true);
      }
    }
    const int64_t n_required = std::count(required.begin(), required.end(), true);
    const int64_t n = static_cast<int64_t>(props.size());
    if (props.empty() && extra.empty() && min_props > 0 && !s.contains("additionalProperties")) {
      extra = "json-value";  // a bare {"minProperties": n}: any keys
    }
    if (props.empty() && !extra.empty() && (min_props > 0 || max_props >= 0)) {
      // Only extra keys: count them.
      if (max_props == 0) return std::string("\"{}\"");
      const std::string kv = absl::StrCat(ExtraKey(declared), " \":\" ", extra);
      const std::string more =
          absl::StrCat("( \",\" ", kv, " ){", std::max<int64_t>(0, min_props - 1), ",",
                       max_props < 0 ? "" : absl::StrCat(max_props - 1), "}");
      const std::string body = absl::StrCat(kv, " ", more);
      return NewRule(
          absl::StrCat("\"{\" ", min_props > 0 ? body : absl::StrCat("( ", body, " )?"), " \"}\""));
    }
    if (min_props > std::max(n_required, extra.empty() ? n : n_required)) {
      if (extra.empty() && min_props > n) {
        return Error(where, "minProperties exceeds the properties allowed");
      }
      if (Refuse()) {
        return Error(where,
                     "minProperties above the number of required properties is not supported");
      }
    }
    if (max_props >= 0 && (!extra.empty() || n > max_props)) {
      if (n_required > max_props) return Error(where, "maxProperties is below the required count");
      if (Refuse()) {
        return Error(where,
                     "maxProperties below the number of properties allowed is not supported");
      }
    }
    std::set<std::string> named = declared;
    for (const std::string& r : req) named.insert(r);
    const std::string extra_key = extra.empty() ? "" : ExtraKey(named);
    // tail(i, started): properties i.. in order, each optional one may be left out.
    std::vector<std::string> tail_names[2];
    tail_names[0].resize(n + 1);
    tail_names[1].resize(n + 1);
    for (int st = 0; st < 2; ++st) {
      std::string sep = st ? "\",\" " : "";
      if (extra.empty()) {
        tail_names[st][n] = "\"\"";
      } else {
        std::string kv = absl::StrCat(extra_key, " \":\" ", extra);
        tail_names[st][n] = NewRule(absl::StrCat("( ", sep, kv, " ( \",\" ", kv, " )* )?"));
      }
    }
    for (int64_t i = n; i-- > 0;) {
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
    if (s.contains("minContains") || s.contains("maxContains")) {
      if (Refuse()) return Error(where, "minContains/maxContains are not supported");
    }
    int64_t min, max;
    if (auto st = Count(s, "minItems", where, &min); !st.ok()) return st;
    if (auto st = Count(s, "maxItems", where, &max); !st.ok()) return st;
    min = std::max<int64_t>(min, 0);
    if (max >= 0 && max < min) return Error(where, "maxItems is below minItems");
    if (s.contains("uniqueItems") &&
        !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()) && Refuse() &&
        !(max >= 0 && max <= 1)) {
      return Error(where, "uniqueItems is not supported (except with maxItems <= 1)");
    }
    // Tuples: prefixItems (2020-12), or items as an array with additionalItems (drafts 4 to 7).
    const Json* tuple = nullptr;
    const Json* rest_schema = nullptr;
    std::string tuple_kw = "prefixItems";
    if (s.contains("prefixItems")) {
      tuple = &s["prefixItems"];
      if (s.contains("items")) rest_schema = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {
      tuple = &s["items"];
      tuple_kw = "items";
      if (s.contains("additionalItems")) rest_schema = &s["additionalItems"];
    } else if (s.contains("items")) {
      rest_schema = &s["items"];
    }
    if (tuple != nullptr && !tuple->is_array())
      return Error(where, absl::StrCat(tuple_kw, " must be an array"));
    std::vector<std::string> prefix;
    if (tuple != nullptr) {
      for (size_t i = 0; i < tuple->size(); ++i) {
        const Json& sub = (*tuple)[i];
        if (sub.is_boolean() && !sub.get<bool>()) {
          // No element may stand here: the array ends before it.
          max = max < 0 ? static_cast<int64_t>(i) : std::min<int64_t>(max, i);
          break;
        }
        auto e = Visit(sub, absl::StrCat(where, "/", tuple_kw, "/", i), depth + 1);
        if (!e.ok()) return e.status();
        prefix.push_back(*e);
      }
    }
    std::string item = "json-value";
    bool items_allowed = true;
    if (rest_schema != nullptr) {
      if (rest_schema->is_boolean() && !rest_schema->get<bool>()) {
        items_allowed = false;
      } else {
        auto e = Visit(*rest_schema,
                       where + (tuple_kw == "items" && tuple ? "/additionalItems" : "/items"),
                       depth + 1);
        if (!e.ok()) return e.status();
        item = *e;
      }
    }
    const int64_t p = static_cast<int64_t>(prefix.size());
    if (!items_allowed) max = max < 0 ? p : std::min(max, p);
    if (max >= 0 && max < min) return Error(where, "no array length satisfies the bounds");
    if (s.contains("contains")) {
      if (tuple != nullptr || rest_schema != nullptr || min > 1 || max >= 0) {
        if (Refuse()) {
          return Error(where, "contains together with items or item counts is not supported");
        }
      } else {
        auto c = Visit(s["contains"], where + "/contains", depth + 1);
        if (!c.ok()) return c.status();
        // The matching element first, then any values (a subset: it may stand anywhere).
        return NewRule(absl::StrCat("\"[\" ", *c, " ( \",\" json-value )* \"]\""));
      }
    }
    if (max == 0) return std::string("\"[]\"");
    // Elements from position i on (each after a comma when i > 0), `i` elements already given.
    auto element = [&](int64_t i) { return i < p ? prefix[i] : item; };
    // After the prefix: the remaining elements of the item schema, counted.
    auto after_prefix = [&](int64_t given) -> std::string {
      const int64_t lo = std::max<int64_t>(0, min - given);
      if (max >= 0 && max - given <= 0) return "\"\"";
      const std::string hi = max < 0 ? "" : absl::StrCat(max - given);
      if (given == 0) {
        // No element yet: the first has no comma.
        const std::string more = absl::StrCat("( \",\" ", item, " ){", std::max<int64_t>(0, lo - 1),
                                              ",", max < 0 ? "" : absl::StrCat(max - 1), "}");
        const std::string body = absl::StrCat(item, " ", more);
        return lo > 0 ? body : absl::StrCat("( ", body, " )?");
      }
      return NewRule(absl::StrCat("( \",\" ", item, " ){", lo, ",", hi, "}"));
    };
    std::string tail = after_prefix(p);
    const int64_t last = max >= 0 ? std::min(p, max) : p;
    for (int64_t i = last; i-- > 0;) {
      std::string with = absl::StrCat(i > 0 ? "\",\" " : "", element(i), " ",
                                      i + 1 < last || (max < 0 || max > p) ? tail : "");
      if (i + 1 == last && max >= 0 && max <= p)
        with = absl::StrCat(i > 0 ? "\",\" " : "", element(i));
      tail = i < min ? NewRule(with) : NewRule(absl::StrCat(with, " | \"\""));
    }
    return NewRule(absl::StrCat("\"[\" ", tail, " \"]\""));
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
      if (auto e = FormatExpr(f); e.has_value()) {
        if (s.contains("minLength") || s.contains("maxLength"))
          return Error(where, "format with minLength/maxLength is not supported");
        return NewRule(absl::StrCat("\"\\\"\" ", *e, " \"\\\"\""));
      }
      if (Refuse()) {
        return Error(where, absl::StrCat("format '", f,
                                         "' is not supported (date, time, date-time, uuid, "
                                         "ipv4, email, hostname are)"));
      }
      // Not strict: an annotation, any string.
    }
    if (min == 0 && max < 0) return std::string("json-string");
    std::string bounds =
        max < 0 ? absl::StrCat("{", min, ",}") : absl::StrCat("{", min, ",", max, "}");
    return NewRule(absl::StrCat("\"\\\"\" json-char", bounds, " \"\\\"\""));
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers; the draft-4 boolean
  // exclusive forms are refused). Integers are exact; numbers keep integral inclusive bounds
  // exact and tighten the others to the integers inside them (a subset of the valid numbers).
  absl::StatusOr<std::string> Number(const Json& s, const std::string& where, bool integer) {
    if (s.contains("multipleOf")) {
      const Json& m = s["multipleOf"];
      if (!m.is_number() || m.get<double>() <= 0) {
        return Error(where, "multipleOf must be a positive number");
      }
      const double v = m.get<double>();
      const bool bounded = s.contains("minimum") || s.contains("maximum") ||
                           s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
      if (v == 1) {
        integer = true;  // multiples of 1 are the integers
      } else if (!bounded && v == std::floor(v) && v <= 1000) {
        return NewRule(MultiplesExpr(static_cast<int64_t>(v),
                                     [this](const std::string& body) { return NewRule(body); }));
      } else if (!bounded && !integer && v < 1 && TenthPower(v) > 0) {
        // 10^-k: numbers with at most k fraction digits.
        return NewRule(absl::StrCat("json-int ( \".\" [0-9]{1,", TenthPower(v), "} )?"));
      } else if (Refuse()) {
        return Error(where,
                     "multipleOf is supported as 1, an integer up to 1000, or 10^-k (without "
                     "numeric bounds)");
      }
    }
    constexpr double kLimit = 9999999999999999.0;  // 16 digits, as the base rules
    std::optional<int64_t> lo, hi;
    for (const char* kw : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(kw)) continue;
      const Json& b = s[kw];
      if (!b.is_number()) {
        if (!Refuse()) continue;
        return Error(where, absl::StrCat(kw,
                                         " must be a number (the draft-4 boolean form is not "
                                         "supported)"));
      }
      const double v = b.get<double>();
      const std::string k = kw;
      const bool lower = k == "minimum" || k == "exclusiveMinimum";
      const bool exclusive = k.rfind("exclusive", 0) == 0;
      double bound;
      if (lower) {
        bound = exclusive ? std::floor(v) + 1 : std::ceil(v);
      } else {
        bound = exclusive ? std::ceil(v) - 1 : std::floor(v);
      }
      bound = std::clamp(bound, -kLimit, kLimit);
      const int64_t ib = static_cast<int64_t>(bound);
      if (lower) {
        lo = lo ? std::max(*lo, ib) : ib;
      } else {
        hi = hi ? std::min(*hi, ib) : ib;
      }
    }
    if (!lo && !hi) return std::string(integer ? "json-int" : "json-number");
    const std::string e = integer ? IntegerRangeExpr(lo, hi) : NumberRangeExpr(lo, hi);
    if (e.empty()) return Error(where, "no number within the bounds can be generated");
    return NewRule(e);
  }

  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> refs_;
  int64_t rule_count_ = 0;
  int64_t enum_count_ = 0;
  int64_t flatten_steps_ = 0;
  int64_t visits_ = 0;
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
