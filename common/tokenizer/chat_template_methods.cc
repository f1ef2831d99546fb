// Methods of the chat-template interpreter's values, with Python's semantics: str (strip,
// split, find, justify...), dict (get, items, keys, values, copy) and list (count, index).
// Methods that mutate (list.append, dict.update) are absent, as in transformers' immutable
// sandbox, where calling them is an error.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_builtins.h"
#include "common/tokenizer/unicode.h"

namespace tandem::chat_template {
namespace {

// str.split (from the left) and str.rsplit (from the right): `sep` undefined or none splits at
// runs of whitespace (no empty strings), at most `maxsplit` times (negative: no limit).
absl::StatusOr<Json> Split(const std::string& s, const Value& sep, int64_t maxsplit,
                           bool from_right) {
  std::vector<std::string> parts;
  auto limited = [&] { return maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit; };
  if (sep.is_undefined() || sep.is_none()) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t j = cps.size();  // the rest, trailing whitespace kept, once the limit is reached
      if (!limited()) {
        j = i;
        while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      }
      std::vector<uint32_t> part(cps.begin() + i, cps.begin() + j);
      if (from_right) std::reverse(part.begin(), part.end());
      parts.push_back(EncodeUtf8(part, 0, part.size()));
      i = j;
    }
  } else {
    if (!sep.is_string()) return TypeError("split: the separator must be a string");
    const std::string& d = sep.data().get_ref<const std::string&>();
    if (d.empty()) return TypeError("split: empty separator");
    if (!from_right) {
      size_t pos = 0;
      for (size_t hit; !limited() && (hit = s.find(d, pos)) != std::string::npos;) {
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + d.size();
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      while (!limited() && end >= d.size()) {
        const size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
      }
      parts.push_back(s.substr(0, end));
    }
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return Json(std::move(parts));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Json& a) {
    if (!a.is_string()) return false;
    const std::string& p = a.get_ref<const std::string&>();
    if (p.size() > s.size()) return false;
    return prefix ? s.compare(0, p.size(), p) == 0
                  : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (affix.is_array()) {
    for (const Json& a : affix.data()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix.data());
}

// Code points in s[0, byte).
int64_t CharIndex(const std::string& s, size_t byte) {
  return static_cast<int64_t>(DecodeUtf8(s.substr(0, byte)).size());
}

// str.ljust / rjust / center / zfill to `width` code points.
absl::StatusOr<Value> Justify(absl::string_view name, const std::string& s, CallArgs& args,
                              Budget* budget) {
  const int64_t width = IntArg(args, 0, "width", 0);
  const int64_t len = static_cast<int64_t>(DecodeUtf8(s).size());
  if (width <= len) return Value(Json(s));
  // Charged before it is built (a fill character is at most 4 bytes); a width past any string's
  // limit is refused before the product could overflow.
  if (width - len > int64_t{1} << 32) {
    return absl::ResourceExhaustedError("chat template: a string grew beyond the size limit");
  }
  if (auto st = budget->Charge(static_cast<size_t>(width - len) * 4 + s.size()); !st.ok()) {
    return st;
  }
  std::string fill = " ";
  if (name != "zfill") {
    Value f = Arg(args, 1, "fillchar");
    if (!f.is_undefined()) {
      if (!f.is_string() || DecodeUtf8(f.data().get<std::string>()).size() != 1) {
        return TypeError(absl::StrCat(name, ": the fill character must be one character"));
      }
      fill = f.data().get<std::string>();
    }
  }
  auto pad = [&](int64_t n) {
    std::string r;
    for (int64_t k = 0; k < n; ++k) r += name == "zfill" ? "0" : fill;
    return r;
  };
  const int64_t total = width - len;
  if (name == "ljust") return Value(Json(s + pad(total)));
  if (name == "rjust") return Value(Json(pad(total) + s));
  if (name == "center") {  // Python puts the odd pad on the left when the width is odd
    const int64_t left = total / 2 + (total & width & 1);
    return Value(Json(pad(left) + s + pad(total - left)));
  }
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');  // zfill
  return Value(Json(sign ? s.substr(0, 1) + pad(total) + s.substr(1) : pad(total) + s));
}

// str.isdigit / isalpha / isalnum / isspace; letters and digits are ASCII.
bool CharClass(absl::string_view name, const std::string& s) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  for (uint32_t c : cps) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool digit = c >= '0' && c <= '9';
    if (name == "isdigit" && !digit) return false;
    if (name == "isalpha" && !letter) return false;
    if (name == "isalnum" && !letter && !digit) return false;
    if (name == "isspace" && !IsPySpace(c)) return false;
  }
  return !cps.empty();
}

absl::StatusOr<Value> StringMethod(const Value& obj, absl::string_view name, CallArgs& args,
                                   Budget* budget) {
  const std::string& s = obj.data().get_ref<const std::string&>();
  if (name == "strip") return Value(Json(Strip(s, Arg(args, 0, "chars"), 'b')));
  if (name == "lstrip") return Value(Json(Strip(s, Arg(args, 0, "chars"), 'l')));
  if (name == "rstrip") return Value(Json(Strip(s, Arg(args, 0, "chars"), 'r')));
  if (name == "startswith" || name == "endswith") {
    return Value(Json(AffixMatch(s, Arg(args, 0, "prefix"), name == "startswith")));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto affix = StringArg(args, 0, name == "removeprefix" ? "prefix" : "suffix", name);
    if (!affix.ok()) return affix.status();
    if (!AffixMatch(s, Value(Json(*affix)), name == "removeprefix")) return obj;
    return Value(Json(name == "removeprefix" ? s.substr(affix->size())
                                             : s.substr(0, s.size() - affix->size())));
  }
  if (name == "split" || name == "rsplit") {
    auto parts = Split(s, Arg(args, 0, "sep"), IntArg(args, 1, "maxsplit", -1), name == "rsplit");
    if (!parts.ok()) return parts.status();
    return Value(std::move(*parts));
  }
  if (name == "splitlines") return Value(Json(SplitLines(s)));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    auto sub = StringArg(args, 0, "sub", name);
    if (!sub.ok()) return sub.status();
    const bool right = name == "rfind" || name == "rindex";
    const size_t at = right ? s.rfind(*sub) : s.find(*sub);
    if (at != std::string::npos) return Value(Json(CharIndex(s, at)));
    if (name == "index" || name == "rindex") return TypeError("substring not found");
    return Value(Json(int64_t{-1}));
  }
  if (name == "count") {
    auto sub = StringArg(args, 0, "sub", name);
    if (!sub.ok()) return sub.status();
    if (sub->empty()) return Value(Json(static_cast<int64_t>(DecodeUtf8(s).size() + 1)));
    int64_t n = 0;
    for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size()))
      ++n;
    return Value(Json(n));
  }
  if (name == "partition" || name == "rpartition") {
    auto sep = StringArg(args, 0, "sep", name);
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return TypeError(absl::StrCat(name, ": empty separator"));
    const size_t at = name == "partition" ? s.find(*sep) : s.rfind(*sep);
    if (at == std::string::npos) {
      return Value(name == "partition" ? Json::array({s, "", ""}) : Json::array({"", "", s}));
    }
    return Value(Json::array({s.substr(0, at), *sep, s.substr(at + sep->size())}));
  }
  if (name == "format") return StrFormat(s, args, budget);
  if (name == "join") {
    CallArgs sep;
    sep.positional.push_back(obj);
    return ApplyFilter("join", Arg(args, 0, "iterable"), sep, budget);
  }
  if (name == "ljust" || name == "rjust" || name == "center" || name == "zfill") {
    return Justify(name, s, args, budget);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
    return Value(Json(CharClass(name, s)));
  }
  if (name == "islower" || name == "isupper") {  // the lower / upper tests
    auto r = ApplyTest(name == "islower" ? "lower" : "upper", obj, args);
    if (!r.ok()) return r.status();
    return Value(Json(*r));
  }
  if (name == "upper") return Value(Json(unicode::ToUpper(s)));
  if (name == "lower") return Value(Json(unicode::ToLower(s)));
  if (name == "title") return Value(Json(unicode::ToTitle(s)));  // str.title, not Jinja's filter
  if (name == "capitalize") return Value(Json(unicode::Capitalize(s)));
  if (name == "swapcase") {  // each character uppercased when that changes it, else lowercased
    std::string out;
    const std::vector<uint32_t> cps = DecodeUtf8(s);
    for (size_t i = 0; i < cps.size(); ++i) {
      const std::string c = EncodeUtf8(cps, i, i + 1);
      const std::string up = unicode::ToUpper(c);
      out += up != c ? up : unicode::ToLower(c);
    }
    return Value(Json(std::move(out)));
  }
  if (name == "replace") return ApplyFilter(name, obj, args, budget);
  return absl::NotFoundError("");
}

}  // namespace

absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, CallArgs& args,
                                 Budget* budget) {
  const Json& j = obj.data();
  if (obj.is_object() || obj.is_namespace()) {
    if (name == "get") {
      Value v = GetItem(obj, Arg(args, 0, "key"));
      if (!v.is_undefined()) return v;
      Value d = Arg(args, 1, "default");
      return d.is_undefined() ? Value(Json()) : d;
    }
    if (name == "items") return ApplyFilter("items", obj, args, budget);
    if (name == "keys" || name == "values") {
      Json out = Json::array();
      for (auto it = j.begin(); it != j.end(); ++it)
        out.push_back(name == "keys" ? KeyValue(it.key()) : it.value());
      return Value(std::move(out));
    }
    if (name == "copy") return Value(j);
    if (name == "cycle" && j.contains("index0") && j.contains("depth0")) {  // loop.cycle(...)
      if (args.positional.empty()) return TypeError("loop.cycle: no items given");
      const size_t i = static_cast<size_t>(j["index0"].get<int64_t>());
      return args.positional[i % args.positional.size()];
    }
    return absl::NotFoundError("");
  }
  if (obj.is_array()) {
    if (name == "count" || name == "index") {
      const Value x = Arg(args, 0, "x");
      int64_t n = 0;
      for (size_t i = 0; i < j.size(); ++i) {
        if (!DataEquals(j[i], x.data())) continue;
        if (name == "index") return Value(Json(static_cast<int64_t>(i)));
        ++n;
      }
      if (name == "index") return TypeError("list.index(x): x not in list");
      return Value(Json(n));
    }
    if (name == "copy") return Value(j);
    return absl::NotFoundError("");
  }
  if (!obj.is_string()) return absl::NotFoundError("");
  return StringMethod(obj, name, args, budget);
}

}  // namespace tandem::chat_template
