#include "common/grammar/json_schema_merge.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/grammar/json_schema_error.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

// A schema's types as a set; nullopt when it does not restrict the type.
std::optional<std::set<std::string>> Types(const Json& s) {
  auto it = s.find("type");
  if (it == s.end()) return std::nullopt;
  std::set<std::string> out;
  if (it->is_string()) out.insert(it->get<std::string>());
  if (it->is_array()) {
    for (const Json& t : *it)
      if (t.is_string()) out.insert(t.get<std::string>());
  }
  return out;
}

Json AllOf(const Json& a, const Json& b) {
  if (a.is_boolean() && a.get<bool>()) return b;
  if (b.is_boolean() && b.get<bool>()) return a;
  if (a == b) return a;
  return Json{{"allOf", Json::array({a, b})}};
}

bool IsFalse(const Json& s) { return s.is_boolean() && !s.get<bool>(); }

const std::set<std::string>& LowerBounds() {
  static const std::set<std::string> k = {"minimum", "exclusiveMinimum", "minLength", "minItems",
                                          "minProperties"};
  return k;
}
const std::set<std::string>& UpperBounds() {
  static const std::set<std::string> k = {"maximum", "exclusiveMaximum", "maxLength", "maxItems",
                                          "maxProperties"};
  return k;
}

// The object keywords of all parts together (see the header).
absl::Status MergeObjects(const std::vector<Json>& parts, const std::string& where, Json* out) {
  std::vector<std::string> keys;  // first appearance order
  std::set<std::string> seen, required;
  bool any_object_keyword = false, explicit_extra = false;
  for (const Json& p : parts) {
    if (auto it = p.find("properties"); it != p.end() && it->is_object()) {
      any_object_keyword = true;
      for (const auto& [k, v] : it->items())
        if (seen.insert(k).second) keys.push_back(k);
    }
    if (auto it = p.find("required"); it != p.end() && it->is_array()) {
      any_object_keyword = true;
      for (const Json& r : *it)
        if (r.is_string()) required.insert(r.get<std::string>());
    }
    if (p.contains("additionalProperties")) any_object_keyword = explicit_extra = true;
  }
  if (!any_object_keyword) return absl::OkStatus();
  Json props = Json::object();
  for (const std::string& k : keys) {
    Json merged = true;
    bool forbidden = false;
    for (const Json& p : parts) {
      Json sub = true;
      if (auto it = p.find("properties"); it != p.end() && it->is_object() && it->contains(k)) {
        sub = (*it)[k];
      } else if (auto a = p.find("additionalProperties"); a != p.end()) {
        sub = *a;
      }
      if (IsFalse(sub)) forbidden = true;
      merged = AllOf(merged, sub);
    }
    if (forbidden) {
      if (required.count(k)) {
        return SchemaError(where,
                           absl::StrCat("allOf: property '", k,
                                        "' is required by one part and forbidden by another"));
      }
      continue;
    }
    props[k] = merged;
  }
  (*out)["properties"] = props;
  Json req = Json::array();
  for (const std::string& k : keys)
    if (required.count(k)) req.push_back(k);
  for (const std::string& r : required) {
    if (!seen.count(r)) {
      // Required but declared nowhere: only each part's additionalProperties speaks for it.
      Json merged = true;
      for (const Json& p : parts) {
        if (auto a = p.find("additionalProperties"); a != p.end()) merged = AllOf(merged, *a);
      }
      if (IsFalse(merged))
        return SchemaError(where, absl::StrCat("allOf: required '", r, "' forbidden"));
      props[r] = merged;
      (*out)["properties"] = props;
      req.push_back(r);
    }
  }
  if (!req.empty()) (*out)["required"] = req;
  if (explicit_extra) {
    Json extra = true;
    for (const Json& p : parts) {
      if (auto a = p.find("additionalProperties"); a != p.end()) extra = AllOf(extra, *a);
    }
    (*out)["additionalProperties"] = extra;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> MergeSchemas(const std::vector<Json>& parts, const std::string& where) {
  Json out = Json::object();
  std::vector<Json> objects;
  for (const Json& p : parts) {
    if (p.is_boolean()) {
      if (!p.get<bool>()) return SchemaError(where, "allOf with a 'false' part matches nothing");
      continue;
    }
    if (!p.is_object()) return SchemaError(where, "allOf parts must be schemas");
    objects.push_back(p);
  }
  for (const Json& p : objects) {
    for (const auto& [k, v] : p.items()) {
      if (k == "properties" || k == "required" || k == "additionalProperties") continue;
      auto have = out.find(k);
      if (have == out.end()) {
        out[k] = v;
        continue;
      }
      if (*have == v) continue;
      if (k == "type") {
        std::set<std::string> a = *Types(out), b = *Types(p), both;
        // integer is a subset of number.
        for (const auto& t : a) {
          if (b.count(t)) both.insert(t);
          if (t == "integer" && b.count("number")) both.insert(t);
          if (t == "number" && b.count("integer")) both.insert("integer");
        }
        if (both.empty()) return SchemaError(where, "allOf: the parts' types do not intersect");
        Json list = Json::array();
        for (const auto& t : both) list.push_back(t);
        out[k] = list.size() == 1 ? list[0] : list;
      } else if (LowerBounds().count(k) || UpperBounds().count(k)) {
        if (!v.is_number() || !have->is_number()) {
          return SchemaError(where, absl::StrCat("allOf: '", k, "' must be a number"));
        }
        const bool lower = LowerBounds().count(k) > 0;
        const bool take =
            lower ? v.get<double>() > have->get<double>() : v.get<double>() < have->get<double>();
        if (take) out[k] = v;
      } else if (k == "enum") {
        if (!v.is_array() || !have->is_array())
          return SchemaError(where, "allOf: enum must be a list");
        Json both = Json::array();
        for (const Json& x : *have)
          if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
        if (both.empty()) return SchemaError(where, "allOf: the parts' enums have no common value");
        out[k] = both;
      } else if (k == "items") {
        out[k] = AllOf(*have, v);
      } else {
        return SchemaError(where, absl::StrCat("allOf: parts that give '", k,
                                               "' different values cannot be merged"));
      }
    }
  }
  if (auto st = MergeObjects(objects, where, &out); !st.ok()) return st;
  // const and enum together: keep the const when the enum lists it.
  if (out.contains("const") && out.contains("enum")) {
    const Json& e = out["enum"];
    if (std::find(e.begin(), e.end(), out["const"]) == e.end())
      return SchemaError(where, "allOf: const is not among the enum values");
    out.erase("enum");
  }
  return out;
}

}  // namespace tandem::grammar
