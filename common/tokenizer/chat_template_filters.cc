// Filters, tests and str/dict methods of the chat-template interpreter.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_builtins.h"
#include "common/tokenizer/unicode.h"

namespace tandem::chat_template {
namespace {

// Jinja's title filter: each run of characters between "-", whitespace, "(", "{", "[" and "<"
// gets its first character uppercased and the rest lowercased (unlike str.title, "don't" stays
// "Don't").
std::string JinjaTitle(const std::string& s) {
  auto is_break = [](uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
  };
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size();) {
    if (is_break(cps[i])) {
      AppendUtf8(cps[i++], &out);
      continue;
    }
    size_t j = i + 1;
    while (j < cps.size() && !is_break(cps[j])) ++j;
    out += unicode::ToUpper(EncodeUtf8(cps, i, i + 1));
    out += unicode::ToLower(EncodeUtf8(cps, i + 1, j));
    i = j;
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) return s;
  std::string r;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    r.append(s, pos, hit - pos);
    r += to;
    pos = hit + from.size();
  }
  r.append(s, pos, std::string::npos);
  return r;
}

// Hugging Face's tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False).
absl::StatusOr<JsonDumpsOptions> JsonDumpsArgs(const CallArgs& args) {
  JsonDumpsOptions o;
  o.ensure_ascii = Arg(args, 0, "ensure_ascii").Truthy();
  Value indent = Arg(args, 1, "indent");
  if (indent.is_string()) {
    o.indent = indent.data().get<std::string>();
    // The output grows with it per nesting level, before the budget sees it.
    if (o.indent->size() > 64) return TypeError("tojson: an indent string longer than 64 bytes");
  } else if (indent.is_number()) {  // Python's " " * n (none for n <= 0)
    o.indent = std::string(
        static_cast<size_t>(std::clamp<int64_t>(IntArg(args, 1, "indent", 0), 0, 64)), ' ');
  } else if (!indent.is_undefined() && !indent.is_none()) {
    return TypeError("tojson: indent must be a number or a string");
  }
  if (o.indent) o.item_separator = ",";
  Value separators = Arg(args, 2, "separators");
  if (!separators.is_undefined() && !separators.is_none()) {
    const Json& sep = separators.data();
    if (!sep.is_array() || sep.size() != 2 || !sep[0].is_string() || !sep[1].is_string()) {
      return TypeError("tojson: separators must be an (item, key) pair of strings");
    }
    o.item_separator = sep[0].get<std::string>();
    o.key_separator = sep[1].get<std::string>();
  }
  o.sort_keys = Arg(args, 3, "sort_keys").Truthy();
  return o;
}

// Python's int(s, base) for a str: surrounding whitespace, a sign, digits with single
// underscores between them; base 0 reads a 0x/0o/0b prefix.
std::optional<int64_t> ParsePythonInt(const std::string& s, int64_t base) {
  const std::string t = Strip(s, Value(), 'b');
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_' && i > 0 && i + 1 < t.size() &&
        std::isalnum(static_cast<unsigned char>(t[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(t[i + 1]))) {
      continue;
    }
    digits.push_back(t[i]);
  }
  if (digits.empty() || std::isspace(static_cast<unsigned char>(digits[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (errno != 0 || end != digits.c_str() + digits.size()) return std::nullopt;
  return static_cast<int64_t>(n);
}

// Python's float(s) for a str: decimal or exponent notation, inf, infinity, nan.
std::optional<double> ParsePythonFloat(const std::string& s) {
  const std::string t = Strip(s, Value(), 'b');
  if (t.empty() || t.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// Python's round(x, n) of a float: to the nearest multiple of 10^-n, ties to even, on the
// exact binary value (glibc's printf rounds it that way).
double PythonRound(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-n));
    return std::nearbyint(x / scale) * scale;
  }
  std::vector<char> buf(static_cast<size_t>(n) + 400);
  std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(n), x);
  return std::strtod(buf.data(), nullptr);
}

// Jinja's indent filter: every line after the first (and the first with `first`) gets `pad`,
// blank lines only with `blank`; line ends become "\n".
absl::StatusOr<std::string> Indent(const std::string& s, const std::string& pad, bool first,
                                   bool blank, Budget* budget) {
  std::vector<std::string> lines = SplitLines(s + "\n");
  if (auto st = budget->Charge(s.size() + lines.size() * (pad.size() + 1)); !st.ok()) return st;
  std::string r = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    r += "\n";
    if (blank || !lines[i].empty()) r += pad;
    r += lines[i];
  }
  return first ? pad + r : r;
}

}  // namespace

bool IsPySpace(uint32_t c) {
  switch (c) {
    case ' ':
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || (c >= 0x2000 && c <= 0x200a);
  }
}

// A copy: Arg returns the argument by value.
absl::StatusOr<std::string> StringArg(const CallArgs& args, size_t i, absl::string_view name,
                                      absl::string_view what) {
  Value v = Arg(args, i, name);
  if (!v.is_string()) return TypeError(absl::StrCat(what, ": expected a string argument"));
  return v.data().get<std::string>();
}

int64_t IntArg(const CallArgs& args, size_t i, absl::string_view name, int64_t fallback) {
  Value v = Arg(args, i, name);
  return v.is_number() ? v.data().get<int64_t>() : fallback;
}

// Python's str.splitlines(): lines without their ends (\n, \r, \r\n, \v, \f, \x1c-\x1e,
// U+0085, U+2028, U+2029).
std::vector<std::string> SplitLines(const std::string& s) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(EncodeUtf8(cps, begin, i));
      if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      begin = i + 1;
    }
  }
  if (begin < cps.size()) lines.push_back(EncodeUtf8(cps, begin, cps.size()));
  return lines;
}

Value Arg(const CallArgs& args, size_t i, absl::string_view name) {
  if (i < args.positional.size()) return args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return value;
  }
  return Value();
}

std::string Strip(const std::string& s, const Value& chars, char mode) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> set;
  const bool whitespace = !chars.is_string();
  if (!whitespace) set = DecodeUtf8(chars.data().get<std::string>());
  auto strip = [&](uint32_t c) {
    return whitespace ? IsPySpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (mode != 'r') {
    while (b < e && strip(cps[b])) ++b;
  }
  if (mode != 'l') {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(cps, b, e);
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs& args,
                                  Budget* budget) {
  const Json& j = input.data();
  const bool is_str = input.is_string();
  auto str = [&]() -> const std::string& { return j.get_ref<const std::string&>(); };
  if (name == "safe" || (name == "string" && is_str)) return input;
  if (name == "string") return Value(Json(input.ToString()));
  if (name == "default" || name == "d") {
    const bool boolean = Arg(args, 1, "boolean").Truthy();
    if (input.is_undefined() || (boolean && !input.Truthy())) {
      Value d = Arg(args, 0, "default_value");
      return d.is_undefined() ? Value(Json("")) : d;
    }
    return input;
  }
  if (name == "length" || name == "count") {
    if (input.is_undefined()) return Value(Json(0));
    if (is_str) return Value(Json(static_cast<int64_t>(DecodeUtf8(str()).size())));
    if (j.is_array() || j.is_object()) return Value(Json(static_cast<int64_t>(j.size())));
    return TypeError("length: object has no length");
  }
  if (name == "tojson") {
    if (input.is_undefined() || input.is_callable()) return TypeError("tojson: not serializable");
    auto options = JsonDumpsArgs(args);
    if (!options.ok()) return options.status();
    std::string s = PythonJsonDumps(j, *options);
    if (auto st = budget->Charge(s.size()); !st.ok()) return st;
    return Value(Json(std::move(s)));
  }
  if (name == "items") {
    if (!j.is_object()) return input.is_undefined() ? Value(Json::array()) : input;
    Json out = Json::array();
    for (auto it = j.begin(); it != j.end(); ++it)
      out.push_back(Json::array({KeyValue(it.key()), it.value()}));
    return Value(std::move(out));
  }
  if (absl::StatusOr<Value> r = ApplyListFilter(name, input, args, budget);
      !absl::IsNotFound(r.status())) {
    return r;
  }
  if (name == "list") {
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    return Value(Json(std::move(*items)));
  }
  if (name == "first" || name == "last") {
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value();
    return Value(name == "first" ? items->front() : items->back());
  }
  if (name == "reverse") {
    if (is_str) {
      std::vector<uint32_t> cps = DecodeUtf8(str());
      std::reverse(cps.begin(), cps.end());
      return Value(Json(EncodeUtf8(cps, 0, cps.size())));
    }
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value(Json(std::move(*items)));
  }
  if (name == "join") {
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    Value sep = Arg(args, 0, "d");
    Value attr = Arg(args, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (i > 0 && sep.is_string()) out += sep.data().get_ref<const std::string&>();
      Value v = attr.is_string() ? GetAttr(Value((*items)[i]), attr.data().get<std::string>())
                                 : Value((*items)[i]);
      out += v.ToString();
      if (auto st = budget->Charge(out.size()); !st.ok()) return st;
    }
    return Value(Json(std::move(out)));
  }
  if (name == "int") {  // int(default=0, base=10); "4.2"|int is 4, as Jinja's quirk has it
    if (j.is_number_integer() || j.is_boolean())
      return Value(Json(j.is_boolean() ? j.get<bool>() : j.get<int64_t>()));
    if (j.is_number_float() && std::isfinite(j.get<double>())) {
      return Value(Json(static_cast<int64_t>(j.get<double>())));
    }
    if (is_str) {
      if (auto n = ParsePythonInt(str(), IntArg(args, 1, "base", 10))) return Value(Json(*n));
      if (auto d = ParsePythonFloat(str()); d && std::isfinite(*d)) {
        return Value(Json(static_cast<int64_t>(*d)));
      }
    }
    Value d = Arg(args, 0, "default");
    return d.is_undefined() ? Value(Json(0)) : d;
  }
  if (name == "float") {  // float(default=0.0)
    if (input.is_number() || j.is_boolean())
      return Value(Json(j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>()));
    if (is_str) {
      if (auto d = ParsePythonFloat(str())) return Value(Json(*d));
    }
    Value d = Arg(args, 0, "default");
    return d.is_undefined() ? Value(Json(0.0)) : d;
  }
  if (name == "abs") {
    if (j.is_number_integer())
      return Value(Json(j.get<int64_t>() < 0 ? -j.get<int64_t>() : j.get<int64_t>()));
    if (input.is_number()) return Value(Json(std::fabs(j.get<double>())));
    return TypeError("abs: expected a number");
  }
  if (name == "round") {  // round(precision=0, method="common"|"floor"|"ceil")
    if (!input.is_number()) return TypeError("round: expected a number");
    const int64_t precision = std::clamp<int64_t>(IntArg(args, 0, "precision", 0), -308, 308);
    Value method = Arg(args, 1, "method");
    const std::string how = method.is_string() ? method.data().get<std::string>() : "common";
    if (how == "common") {  // Python's round(): an int stays an int
      if (j.is_number_integer() && precision >= 0) return input;
      return Value(Json(PythonRound(j.get<double>(), precision)));
    }
    if (how != "floor" && how != "ceil") {
      return TypeError("round: method must be 'common', 'ceil' or 'floor'");
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double v = j.get<double>() * scale;
    return Value(Json((how == "floor" ? std::floor(v) : std::ceil(v)) / scale));
  }
  if (name == "sum") {  // sum(attribute=None, start=0)
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    Value attr = Arg(args, 0, "attribute");
    Value acc = Arg(args, 1, "start");
    if (acc.is_undefined()) acc = Value(Json(0));
    for (const Json& item : *items) {
      Value v = attr.is_undefined() ? Value(item) : GetAttrPath(Value(item), attr.ToString());
      auto r = BinaryOp("+", acc, v, budget);
      if (!r.ok()) return r.status();
      acc = *r;
    }
    return acc;
  }
  if (name == "min" || name == "max") {  // min/max(case_sensitive=False, attribute=None)
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value();
    const bool case_sensitive = Arg(args, 0, "case_sensitive").Truthy();
    Value attr = Arg(args, 1, "attribute");
    auto key = [&](const Json& item) {
      Value v = attr.is_undefined() ? Value(item) : GetAttrPath(Value(item), attr.ToString());
      if (!case_sensitive && v.is_string()) return Value(Json(unicode::ToLower(v.ToString())));
      return v;
    };
    size_t best = 0;
    Value best_key = key(items->front());
    for (size_t i = 1; i < items->size(); ++i) {
      Value k = key((*items)[i]);
      auto r = BinaryOp(name == "min" ? "<" : ">", k, best_key, budget);
      if (!r.ok()) return r.status();
      if (r->Truthy()) best = i, best_key = std::move(k);
    }
    return Value((*items)[best]);
  }
  if (!is_str) {
    if (input.is_undefined() && (name == "trim" || name == "upper" || name == "lower"))
      return Value(Json(""));
    return TypeError(absl::StrCat("filter '", name, "' expects a string"));
  }
  if (name == "trim") return Value(Json(Strip(str(), Arg(args, 0, "chars"), 'b')));
  if (name == "upper") return Value(Json(unicode::ToUpper(str())));
  if (name == "lower") return Value(Json(unicode::ToLower(str())));
  if (name == "capitalize") return Value(Json(unicode::Capitalize(str())));
  if (name == "title") return Value(Json(JinjaTitle(str())));
  if (name == "replace") {
    auto from = StringArg(args, 0, "old", "replace");
    auto to = StringArg(args, 1, "new", "replace");
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    std::string r = Replace(str(), *from, *to, IntArg(args, 2, "count", -1));
    if (auto st = budget->Charge(r.size()); !st.ok()) return st;
    return Value(Json(std::move(r)));
  }
  if (name == "format") {  // Jinja's: value % args, or value % kwargs
    if (!args.positional.empty() && !args.keyword.empty()) {
      return TypeError("format: positional and keyword arguments together");
    }
    Json a = Json::array();
    for (const Value& v : args.positional) a.push_back(v.data());
    if (!args.keyword.empty()) {
      a = Json::object();
      for (const auto& [k, v] : args.keyword) a[k] = v.data();
    }
    const bool one = a.is_array() && a.size() == 1;
    return PercentFormat(str(), one ? Value(a[0]) : Value(std::move(a)), budget);
  }
  if (name == "center") {  // center(width=80)
    CallArgs w;
    w.positional.push_back(Value(Json(IntArg(args, 0, "width", 80))));
    return CallMethod(input, "center", w, budget);
  }
  if (name == "wordcount") {  // runs of word characters (letters, digits, _; non-ASCII as letters)
    int64_t words = 0;
    bool in_word = false;
    for (unsigned char c : str()) {
      const bool w = c >= 0x80 || std::isalnum(c) || c == '_';
      words += w && !in_word ? 1 : 0;
      in_word = w;
    }
    return Value(Json(words));
  }
  if (name == "truncate") {  // truncate(length=255, killwords=False, end="...", leeway=5)
    const int64_t length = IntArg(args, 0, "length", 255);
    const bool killwords = Arg(args, 1, "killwords").Truthy();
    Value end_arg = Arg(args, 2, "end");
    const std::string end = end_arg.is_string() ? end_arg.ToString() : "...";
    const int64_t leeway = IntArg(args, 3, "leeway", 5);
    const std::vector<uint32_t> cps = DecodeUtf8(str());
    const int64_t end_len = static_cast<int64_t>(DecodeUtf8(end).size());
    if (length < end_len || leeway < 0) return TypeError("truncate: length shorter than end");
    // len(s) <= length + leeway, without overflow for any length.
    if (static_cast<int64_t>(cps.size()) - leeway <= length) return input;
    std::string r = EncodeUtf8(cps, 0, static_cast<size_t>(length - end_len));
    if (!killwords) {
      const size_t space = r.rfind(' ');
      if (space != std::string::npos) r.resize(space);
    }
    return Value(Json(r + end));
  }
  if (name == "escape" || name == "e") {
    std::string r;
    for (char c : str()) {
      switch (c) {
        case '&':
          r += "&amp;";
          break;
        case '<':
          r += "&lt;";
          break;
        case '>':
          r += "&gt;";
          break;
        case '"':
          r += "&#34;";
          break;
        case '\'':
          r += "&#39;";
          break;
        default:
          r.push_back(c);
      }
    }
    return Value(Json(std::move(r)));
  }
  if (name == "indent") {  // indent(width=4, first=False, blank=False); width may be a string
    Value width = Arg(args, 0, "width");
    const std::string pad =
        width.is_string()
            ? width.data().get<std::string>()
            : std::string(
                  static_cast<size_t>(std::clamp<int64_t>(IntArg(args, 0, "width", 4), 0, 64)),
                  ' ');
    auto r =
        Indent(str(), pad, Arg(args, 1, "first").Truthy(), Arg(args, 2, "blank").Truthy(), budget);
    if (!r.ok()) return r.status();
    return Value(Json(std::move(*r)));
  }
  return TypeError(absl::StrCat("unknown filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, CallArgs& args) {
  const Json& j = v.data();
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_data() && j.is_boolean();
  if (name == "true") return v.is_data() && j.is_boolean() && j.get<bool>();
  if (name == "false") return v.is_data() && j.is_boolean() && !j.get<bool>();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_data() && j.is_number_integer();
  if (name == "float") return v.is_data() && j.is_number_float();
  if (name == "mapping") return v.is_object() || v.is_namespace();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  // Jinja's Undefined iterates as empty and has __call__ (which raises).
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "callable") return v.is_callable() || v.is_undefined();
  if (name == "lower" || name == "upper") {  // str.islower / isupper: cased, all one case
    if (!v.is_string()) return false;
    const std::string& s = j.get_ref<const std::string&>();
    const std::string lower = unicode::ToLower(s), upper = unicode::ToUpper(s);
    return lower != upper && s == (name == "lower" ? lower : upper);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_data() || !j.is_number_integer())
      return TypeError(absl::StrCat(name, ": expected an integer"));
    const int64_t n = j.get<int64_t>();
    if (name == "odd") return n % 2 != 0;
    if (name == "even") return n % 2 == 0;
    const int64_t d = IntArg(args, 0, "num", 0);
    if (d == 0) return TypeError("divisibleby: division by zero");
    return n % d == 0;
  }
  static constexpr std::pair<absl::string_view, absl::string_view> kComparisons[] = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"sameas", "=="}, {"ne", "!="},
      {"!=", "!="}, {"lt", "<"},       {"<", "<"},   {"le", "<="},     {"<=", "<="},
      {"gt", ">"},  {">", ">"},        {"ge", ">="}, {">=", ">="},     {"in", "in"}};
  for (const auto& [test, op] : kComparisons) {
    if (name != test) continue;
    Budget unlimited;
    auto r = BinaryOp(op, v, Arg(args, 0, "other"), &unlimited);
    if (!r.ok()) return r.status();
    return r->Truthy();
  }
  return TypeError(absl::StrCat("unknown test '", name, "'"));
}

}  // namespace tandem::chat_template
