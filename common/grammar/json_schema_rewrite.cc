#include "common/grammar/json_schema_rewrite.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/json_schema_error.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

// Keywords that only annotate: they never change which documents validate.
const std::set<std::string>& SchemaAnnotations() {
  static const std::set<std::string> k = {
      "$schema",     "$id",     "id",          "$comment",         "title",
      "description", "default", "examples",    "deprecated",       "readOnly",
      "writeOnly",   "$defs",   "definitions", "contentMediaType", "contentEncoding",
      "$anchor",     "strict",  "name"};
  return k;
}

// Validation keywords of `s` other than `except` (annotations do not count).
bool HasValidationKeywords(const Json& s, std::string_view except) {
  for (const auto& [key, value] : s.items()) {
    if (key != except && !SchemaAnnotations().count(key)) return true;
  }
  return false;
}

// Whether the value `v` satisfies the simple keywords of `s` beside enum/const (type, numeric
// and length bounds); nullopt when `s` has a keyword this check does not know.
std::optional<bool> ValueFits(const Json& v, const Json& s) {
  for (const auto& [key, want] : s.items()) {
    if (key == "enum" || key == "const" || SchemaAnnotations().count(key)) continue;
    if (key == "type") {
      std::vector<std::string> types;
      if (want.is_string()) types.push_back(want.get<std::string>());
      if (want.is_array())
        for (const Json& t : want)
          if (t.is_string()) types.push_back(t.get<std::string>());
      bool any = false;
      for (const std::string& t : types) {
        any = any || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
              (t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
              (t == "null" && v.is_null()) || (t == "number" && v.is_number()) ||
              (t == "integer" && v.is_number() && v.get<double>() == std::floor(v.get<double>()));
      }
      if (!any) return false;
    } else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" ||
               key == "exclusiveMaximum") {
      if (!want.is_number()) return std::nullopt;
      if (!v.is_number()) continue;
      const double x = v.get<double>(), b = want.get<double>();
      if ((key == "minimum" && x < b) || (key == "maximum" && x > b) ||
          (key == "exclusiveMinimum" && x <= b) || (key == "exclusiveMaximum" && x >= b)) {
        return false;
      }
    } else if (key == "minLength" || key == "maxLength") {
      if (!want.is_number_integer()) return std::nullopt;
      if (!v.is_string()) continue;
      int64_t n = 0;  // code points
      for (unsigned char c : v.get_ref<const std::string&>()) n += (c & 0xC0) != 0x80;
      if ((key == "minLength" && n < want.get<int64_t>()) ||
          (key == "maxLength" && n > want.get<int64_t>())) {
        return false;
      }
    } else {
      return std::nullopt;
    }
  }
  return true;
}

// Keywords honoured by narrowing the output to a subset of the valid documents, rewritten into
// the others: if/then/else (documents that satisfy if and then), not of types (the other
// types), dependencies (a dependent property is left out unless required, then its
// dependencies apply), patternProperties and propertyNames (on the declared properties when no
// other keys may appear). nullopt: nothing to rewrite.
absl::StatusOr<std::optional<Json>> RewriteNarrowing(const Json& s, const std::string& where,
                                                     bool strict) {
  static const char* kKeys[] = {"if",
                                "then",
                                "else",
                                "not",
                                "dependencies",
                                "dependentRequired",
                                "dependentSchemas",
                                "patternProperties",
                                "propertyNames"};
  bool any = false;
  for (const char* k : kKeys) any = any || s.contains(k);
  if (!any) return std::optional<Json>();
  Json out = s;
  std::vector<Json> all;
  if (s.contains("if") || s.contains("then") || s.contains("else")) {
    out.erase("if");
    out.erase("then");
    out.erase("else");
    if (s.contains("if")) {
      all.push_back(s["if"]);
      if (s.contains("then")) all.push_back(s["then"]);
    }
  }
  if (s.contains("not")) {
    const Json& n = s["not"];
    out.erase("not");
    if (!(n.is_boolean() && !n.get<bool>())) {
      if (!n.is_object() || !n.contains("type") || HasValidationKeywords(n, "type")) {
        if (strict) {
          return SchemaError(where + "/not",
                             "'not' is supported only with types ({\"not\": {\"type\": ...}})");
        }
      } else {
        std::set<std::string> removed;
        if (n["type"].is_string()) removed.insert(n["type"].get<std::string>());
        if (n["type"].is_array())
          for (const Json& t : n["type"])
            if (t.is_string()) removed.insert(t.get<std::string>());
        if (removed.count("integer") && !removed.count("number")) {
          if (strict) return SchemaError(where + "/not", "'not' of integer alone is not supported");
        } else {
          Json left = Json::array();
          for (const char* t : {"object", "array", "string", "number", "boolean", "null"}) {
            if (!removed.count(t)) left.push_back(t);
          }
          if (left.empty()) return SchemaError(where + "/not", "excludes every type");
          all.push_back(Json{{"type", left}});
        }
      }
    }
  }
  for (const char* kw : {"dependencies", "dependentRequired", "dependentSchemas"}) {
    if (!s.contains(kw)) continue;
    out.erase(kw);
    const Json& deps = s[kw];
    if (!deps.is_object()) return SchemaError(where, absl::StrCat(kw, " must be an object"));
    std::set<std::string> req;
    if (out.contains("required") && out["required"].is_array()) {
      for (const Json& r : out["required"])
        if (r.is_string()) req.insert(r.get<std::string>());
    }
    for (const auto& [key, dep] : deps.items()) {
      if (!req.count(key)) {
        // Left out, the dependency never applies.
        out["properties"][key] = false;
      } else if (dep.is_array()) {
        for (const Json& d : dep) {
          if (d.is_string() && !req.count(d.get<std::string>())) {
            out["required"].push_back(d);
            req.insert(d.get<std::string>());
          }
        }
      } else {
        all.push_back(dep);
      }
    }
  }
  const bool closed =
      !out.contains("additionalProperties") ||
      (out["additionalProperties"].is_boolean() && !out["additionalProperties"].get<bool>());
  if (s.contains("patternProperties")) {
    out.erase("patternProperties");
    const bool declared =
        out.contains("properties") && out["properties"].is_object() && !out["properties"].empty();
    if ((declared || !closed) && strict) {
      return SchemaError(where,
                         "patternProperties is supported only when no key may appear (no "
                         "properties, additionalProperties absent or false)");
    }
  }
  if (s.contains("propertyNames")) {
    out.erase("propertyNames");
    const Json& names = s["propertyNames"];
    if (!closed) {
      if (strict) {
        return SchemaError(where,
                           "propertyNames is supported only with additionalProperties absent or "
                           "false");
      }
    } else if (out.contains("properties") && out["properties"].is_object()) {
      std::set<std::string> req;
      if (out.contains("required") && out["required"].is_array()) {
        for (const Json& r : out["required"])
          if (r.is_string()) req.insert(r.get<std::string>());
      }
      for (auto& [key, sub] : out["properties"].items()) {
        std::optional<bool> fits =
            names.is_boolean() ? std::optional<bool>(names.get<bool>())
                               : (names.is_object() ? ValueFits(Json(key), names) : std::nullopt);
        if (fits.value_or(false) && names.is_object()) {
          if (names.contains("const") && names["const"] != Json(key)) fits = false;
          if (names.contains("enum") && names["enum"].is_array() &&
              std::find(names["enum"].begin(), names["enum"].end(), Json(key)) ==
                  names["enum"].end()) {
            fits = false;
          }
        }
        if (!fits.has_value()) {
          if (strict) {
            return SchemaError(where + "/propertyNames",
                               "only type, enum/const and length bounds are supported here");
          }
          continue;
        }
        if (!*fits) {
          if (req.count(key)) {
            return SchemaError(where, absl::StrCat("required property '", key,
                                                   "' does not satisfy propertyNames"));
          }
          sub = false;
        }
      }
    }
  }
  const bool object_keywords = s.contains("patternProperties") || s.contains("propertyNames") ||
                               s.contains("dependencies") || s.contains("dependentRequired") ||
                               s.contains("dependentSchemas");
  if (object_keywords && !out.contains("type")) {
    // What was dropped constrained objects: keep to objects under the closed default.
    out["type"] = "object";
  }
  if (!all.empty()) {
    all.insert(all.begin(), out);
    return std::optional<Json>(Json{{"allOf", all}});
  }
  return std::optional<Json>(out);
}

}  // namespace tandem::grammar
