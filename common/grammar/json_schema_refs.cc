#include "common/grammar/json_schema_refs.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/grammar/json_schema_rewrite.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

// The const/enum values a required property `key` of object schema `s` may take; empty when
// the property is not required or not limited to listed values.
std::set<std::string> TagValues(const Json& s, const std::string& key) {
  std::set<std::string> out;
  if (!s.is_object() || !s.contains("required") || !s["required"].is_array() ||
      std::find(s["required"].begin(), s["required"].end(), Json(key)) == s["required"].end() ||
      !s.contains("properties") || !s["properties"].is_object() || !s["properties"].contains(key) ||
      !s["properties"][key].is_object()) {
    return out;
  }
  const Json& p = s["properties"][key];
  if (p.contains("const")) {
    out.insert(p["const"].dump());
  } else if (p.contains("enum") && p["enum"].is_array()) {
    for (const Json& v : p["enum"]) out.insert(v.dump());
  }
  return out;
}
// oneOf alternatives that are objects told apart by a required tag property (a discriminator:
// {"kind": {"const": "circle"}}) whose values differ between alternatives: a document made
// from one alternative fails every other.
bool Discriminated(const Json& root, const Json& alts) {
  std::vector<const Json*> resolved;
  for (const Json& a : alts) {
    const Json* node = &a;
    for (int hops = 0; node->is_object() && node->contains("$ref") && hops < 16; ++hops) {
      if (!(*node)["$ref"].is_string() || HasValidationKeywords(*node, "$ref")) return false;
      node = ResolveLocalRef(root, (*node)["$ref"].get<std::string>());
      if (node == nullptr) return false;
    }
    if (!node->is_object()) return false;
    resolved.push_back(node);
  }
  if (resolved.empty() || !resolved[0]->contains("properties") ||
      !(*resolved[0])["properties"].is_object()) {
    return false;
  }
  for (const auto& [key, unused] : (*resolved[0])["properties"].items()) {
    std::set<std::string> seen;
    bool ok = true;
    for (const Json* r : resolved) {
      const std::set<std::string> tags = TagValues(*r, key);
      if (tags.empty()) ok = false;
      for (const std::string& t : tags) ok = ok && seen.insert(t).second;
      if (!ok) break;
    }
    if (ok) return true;
  }
  return false;
}

}  // namespace

const Json* ResolveLocalRef(const Json& root, const std::string& target) {
  if (target.empty() || target[0] != '#') return nullptr;
  const Json* node = &root;
  if (target.size() == 1) return node;
  if (target[1] != '/') return nullptr;
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
    } else if (node->is_array() && !key.empty() && key.size() < 10 &&
               std::all_of(key.begin(), key.end(), ::isdigit) && std::stoul(key) < node->size()) {
      node = &(*node)[std::stoul(key)];
    } else {
      return nullptr;
    }
  }
  return node;
}

bool OneOfDisjoint(const Json& root, const Json& alts) {
  std::set<std::string> types, values;
  bool by_type = true, by_value = true;
  for (const Json& a : alts) {
    if (a.is_boolean() && !a.get<bool>()) continue;  // matches nothing
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
  return by_type || by_value || Discriminated(root, alts);
}

}  // namespace tandem::grammar
