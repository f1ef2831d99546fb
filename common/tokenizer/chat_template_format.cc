// String formatting of the chat-template interpreter, with Python's semantics: printf-style
// `"%s: %d" % (a, b)` (also Jinja's `format` filter) and `"{}: {:>4}".format(a, b)`.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_builtins.h"

namespace tandem::chat_template {
namespace {

// The C formatting of one number: `spec` is a printf conversion ("%+08.3f"), `v` an int64 or a
// double as the conversion wants.
template <typename T>
std::string CFormat(const std::string& spec, T v) {
  char small[128];
  const int n = std::snprintf(small, sizeof small, spec.c_str(), v);
  if (n < 0) return "";
  if (static_cast<size_t>(n) < sizeof small) return std::string(small, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), spec.c_str(), v);
  big.resize(static_cast<size_t>(n));
  return big;
}

size_t CodePoints(const std::string& s) { return DecodeUtf8(s).size(); }

// The first `n` code points of s.
std::string Prefix(const std::string& s, int64_t n) {
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  return EncodeUtf8(cps, 0, std::min(cps.size(), static_cast<size_t>(std::max<int64_t>(n, 0))));
}

// s padded with `fill` to `width` code points: '<' left, '>' right, '^' centre (the odd one
// right, as Python's format does).
std::string Pad(const std::string& s, int64_t width, char align, const std::string& fill) {
  const int64_t len = static_cast<int64_t>(CodePoints(s));
  if (width <= len) return s;
  const int64_t total = width - len;
  const int64_t left = align == '<' ? 0 : align == '>' ? total : total / 2;
  std::string r;
  for (int64_t i = 0; i < left; ++i) r += fill;
  r += s;
  for (int64_t i = left; i < total; ++i) r += fill;
  return r;
}

absl::StatusOr<int64_t> AsInteger(const Value& v, char conversion) {
  const Json& j = v.data();
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_integer() || j.is_number_unsigned()) return j.get<int64_t>();
  if (j.is_number_float() && std::isfinite(j.get<double>()) && conversion != 'x' &&
      conversion != 'X' && conversion != 'o' && conversion != 'c') {
    return static_cast<int64_t>(j.get<double>());
  }
  return TypeError(absl::StrCat("%", std::string(1, conversion), " format: a number is required"));
}

absl::StatusOr<double> AsReal(const Value& v) {
  const Json& j = v.data();
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number()) return j.get<double>();
  return TypeError("format: a real number is required");
}

// One printf conversion of `v`: flags ("-+ #0"), width and precision (-1: none).
absl::StatusOr<std::string> PercentOne(char conversion, const std::string& flags, int64_t width,
                                       int64_t precision, const Value& v) {
  const bool left = flags.find('-') != std::string::npos;
  std::string spec = "%" + flags;
  if (width >= 0) spec += std::to_string(width);
  if (precision >= 0) spec += "." + std::to_string(precision);
  switch (conversion) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = conversion == 's' ? v.ToString() : PythonRepr(v.data());
      if (precision >= 0) s = Prefix(s, precision);
      return Pad(s, width, left ? '<' : '>', " ");
    }
    case 'c': {
      std::string s;
      if (v.is_string() && CodePoints(v.ToString()) == 1) {
        s = v.ToString();
      } else {
        auto n = AsInteger(v, 'c');
        if (!n.ok()) return n.status();
        if (*n < 0 || *n > 0x10ffff) return TypeError("%c arg not in range(0x110000)");
        AppendUtf8(static_cast<uint32_t>(*n), &s);
      }
      return Pad(s, width, left ? '<' : '>', " ");
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': {
      auto n = AsInteger(v, conversion);
      if (!n.ok()) return n.status();
      const char c = conversion == 'i' || conversion == 'u' ? 'd' : conversion;
      std::string out = CFormat(spec + "ll" + std::string(1, c), static_cast<long long>(*n));
      if (c == 'o' && flags.find('#') != std::string::npos) {  // Python writes 0o17, C 017
        const size_t zero = out.find('0');
        if (zero != std::string::npos) out.insert(zero + 1, "o");
      }
      return out;
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      auto d = AsReal(v);
      if (!d.ok()) return d.status();
      return CFormat(spec + std::string(1, conversion), *d);
    }
    default:
      return TypeError(
          absl::StrCat("unsupported format character '", std::string(1, conversion), "'"));
  }
}

}  // namespace

absl::StatusOr<Value> PercentFormat(const std::string& format, const Value& args, Budget* budget) {
  std::vector<Value> positional;
  // A mapping feeds %(name)s conversions; a format without them prints it as one value.
  const bool mapping =
      (args.is_object() || args.is_namespace()) && format.find("%(") != std::string::npos;
  size_t conversions = 0;  // the values the format takes, a '*' width or precision included
  for (size_t i = 0; i + 1 < format.size(); ++i) {
    if (format[i] != '%') continue;
    if (format[++i] == '%') continue;
    ++conversions;
    for (;
         i < format.size() && std::string("-+ #0123456789.*").find(format[i]) != std::string::npos;
         ++i) {
      conversions += format[i] == '*' ? 1 : 0;
    }
  }
  // Tuples are lists here: a list is the arguments when it has one per conversion.
  if (args.is_array() && args.data().size() == conversions && conversions != 1) {
    for (const Json& a : args.data()) positional.emplace_back(a);
  } else if (args.is_array() && conversions == 1 && args.data().size() == 1) {
    positional.emplace_back(args.data()[0]);
  } else if (!mapping) {
    positional.push_back(args);
  }
  std::string out;
  size_t next = 0;
  auto take = [&]() -> absl::StatusOr<Value> {
    if (next >= positional.size()) return TypeError("not enough arguments for format string");
    return positional[next++];
  };
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return TypeError("incomplete format");
    Value key;
    if (format[i] == '(') {  // %(name)s
      const size_t close = format.find(')', i);
      if (close == std::string::npos || !mapping) return TypeError("format requires a mapping");
      key = GetAttr(args, format.substr(i + 1, close - i - 1));
      if (key.is_undefined()) return TypeError("format: a key is missing from the mapping");
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos) {
      flags.push_back(format[i++]);
    }
    int64_t width = -1, precision = -1;
    auto number = [&](int64_t* n) -> absl::Status {
      if (i < format.size() && format[i] == '*') {
        ++i;
        auto v = take();
        if (!v.ok()) return v.status();
        auto w = AsInteger(*v, '*');
        if (!w.ok()) return w.status();
        if (*w > 1000000) return TypeError("format: width or precision too big");
        *n = *w;
        return absl::OkStatus();
      }
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        *n = std::max<int64_t>(*n, 0) * 10 + (format[i++] - '0');
        if (*n > 1000000) return TypeError("format: width or precision too big");
      }
      return absl::OkStatus();
    };
    if (auto st = number(&width); !st.ok()) return st;
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      if (auto st = number(&precision); !st.ok()) return st;
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return TypeError("incomplete format");
    if (format[i] == '%') {
      out.push_back('%');
      continue;
    }
    Value v = key;
    if (key.is_undefined()) {
      auto t = take();
      if (!t.ok()) return t.status();
      v = *t;
    }
    if (width > 0 && budget != nullptr) {
      if (auto st = budget->Charge(static_cast<size_t>(width)); !st.ok()) return st;
    }
    auto one = PercentOne(format[i], flags, width, precision, v);
    if (!one.ok()) return one.status();
    out += *one;
  }
  if (!mapping && next < positional.size()) {
    return TypeError("not all arguments converted during string formatting");
  }
  if (budget != nullptr) {
    if (auto st = budget->Charge(out.size()); !st.ok()) return st;
  }
  return Value(Json(std::move(out)));
}

absl::StatusOr<Value> StrFormat(const std::string& format, const CallArgs& args, Budget* budget) {
  std::string out;
  size_t auto_index = 0;
  int manual_numbering = -1;  // {} (0) and {0} (1) do not mix, as in Python
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;  // "}}"
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {  // "{{"
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) return TypeError("format: single '{' encountered");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    char conversion = 0;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    // The argument: "" (next), an index or a keyword, then .attr / [key] parts.
    size_t end = field.find_first_of(".[");
    const std::string head = field.substr(0, end);
    Value v;
    const bool numbered = !head.empty() && std::all_of(head.begin(), head.end(),
                                                       [](char d) { return d >= '0' && d <= '9'; });
    if (head.empty() ? manual_numbering == 1 : numbered && manual_numbering == 0) {
      // string.Formatter's words (jinja2's sandbox formats with it), either way round.
      return TypeError(
          "cannot switch from manual field specification to automatic field numbering");
    }
    if (head.empty() || numbered) manual_numbering = numbered ? 1 : 0;
    if (head.empty()) {
      v = Arg(args, auto_index++, "");
    } else if (numbered) {
      v = Arg(args, static_cast<size_t>(std::stoul(head.substr(0, 9))), "");
    } else {
      v = Arg(args, SIZE_MAX, head);
    }
    while (end != std::string::npos && end < field.size()) {
      if (field[end] == '.') {
        const size_t next = field.find_first_of(".[", end + 1);
        v = GetAttr(v, field.substr(end + 1, next == std::string::npos ? std::string::npos
                                                                       : next - end - 1));
        end = next;
      } else {
        const size_t rb = field.find(']', end);
        if (rb == std::string::npos) return TypeError("format: missing ']'");
        const std::string k = field.substr(end + 1, rb - end - 1);
        const bool digits = !k.empty() && std::all_of(k.begin(), k.end(),
                                                      [](char d) { return d >= '0' && d <= '9'; });
        v = GetItem(v, digits ? Value(Json(static_cast<int64_t>(std::stoll(k.substr(0, 18)))))
                              : Value(Json(k)));
        end = rb + 1 < field.size() ? rb + 1 : std::string::npos;
      }
    }
    if (v.is_undefined()) return TypeError("format: a replacement field names no argument");
    if (conversion == 'r' || conversion == 'a') v = Value(Json(PythonRepr(v.data())));
    if (conversion == 's') v = Value(Json(v.ToString()));
    // The format spec: [[fill]align][sign][#][0][width][,_][.precision][type].
    std::string fill = " ";
    char align = 0, sign = '-';
    bool alt = false, zero = false;
    int64_t width = -1, precision = -1;
    char grouping = 0, type = 0;
    size_t k = 0;
    auto is_align = [](char a) { return a == '<' || a == '>' || a == '^' || a == '='; };
    if (spec.size() >= 2 && is_align(spec[1])) {
      fill = spec.substr(0, 1), align = spec[1], k = 2;
    } else if (!spec.empty() && is_align(spec[0])) {
      align = spec[0], k = 1;
    }
    if (k < spec.size() && (spec[k] == '+' || spec[k] == '-' || spec[k] == ' ')) sign = spec[k++];
    if (k < spec.size() && spec[k] == '#') alt = true, ++k;
    if (k < spec.size() && spec[k] == '0') zero = true, ++k;
    while (k < spec.size() && spec[k] >= '0' && spec[k] <= '9' && width < 100000) {
      width = std::max<int64_t>(width, 0) * 10 + (spec[k++] - '0');
    }
    if (k < spec.size() && (spec[k] == ',' || spec[k] == '_')) grouping = spec[k++];
    if (k < spec.size() && spec[k] == '.') {
      precision = 0;
      for (++k; k < spec.size() && spec[k] >= '0' && spec[k] <= '9' && precision < 1000; ++k) {
        precision = precision * 10 + (spec[k] - '0');
      }
    }
    if (k < spec.size()) type = spec[k++];
    if (k != spec.size()) return TypeError("format: invalid format specifier");
    if (width > 0 && budget != nullptr) {
      if (auto st = budget->Charge(static_cast<size_t>(width)); !st.ok()) return st;
    }
    std::string text;
    const bool number = v.is_number() || (v.is_data() && v.data().is_boolean() && type != 0);
    if (!number || type == 's') {
      if (type != 0 && type != 's') return TypeError("format: unknown code for a string");
      text = v.ToString();
      if (precision >= 0) text = Prefix(text, precision);
      out += Pad(text, width, align ? align : '<', fill);
      continue;
    }
    std::string flags;
    if (sign != '-') flags.push_back(sign);
    if (alt) flags.push_back('#');
    const bool integral = v.data().is_number_integer() || v.data().is_boolean();
    if (type == 0 && !integral) {  // Python's repr of a float (precision: like 'g')
      text = precision >= 0 ? *PercentOne('g', flags, -1, precision, v) : v.ToString();
      if (sign == '+' && text[0] != '-') text = "+" + text;
    } else if (type == '%') {
      auto d = AsReal(v);
      if (!d.ok()) return d.status();
      text =
          *PercentOne('f', flags, -1, precision < 0 ? 6 : precision, Value(Json(*d * 100))) + "%";
    } else if (type == 'b') {
      auto n = AsInteger(v, 'b');
      if (!n.ok()) return n.status();
      uint64_t u = *n < 0 ? static_cast<uint64_t>(-*n) : static_cast<uint64_t>(*n);
      do {
        text.insert(text.begin(), static_cast<char>('0' + (u & 1)));
        u >>= 1;
      } while (u != 0);
      if (alt) text = "0b" + text;
      if (*n < 0)
        text = "-" + text;
      else if (sign != '-')
        text = std::string(1, sign) + text;
    } else {
      const char conv = type == 0 || type == 'n' ? (integral ? 'd' : 'g') : type;
      if (std::string("dxXoeEfFgGc").find(conv) == std::string::npos) {
        return TypeError("format: unknown code for a number");
      }
      auto one = PercentOne(conv, flags, -1, conv == 'd' ? -1 : precision, v);
      if (!one.ok()) return one.status();
      text = *one;
    }
    if (grouping != 0) {  // thousands separators on the integer digits
      size_t digits_end = text.find_first_not_of(
          "0123456789", text[0] == '-' || text[0] == '+' || text[0] == ' ' ? 1 : 0);
      if (digits_end == std::string::npos) digits_end = text.size();
      const size_t digits_begin = text[0] == '-' || text[0] == '+' || text[0] == ' ' ? 1 : 0;
      for (size_t p = digits_end; p > digits_begin + 3; p -= 3) text.insert(p - 3, 1, grouping);
    }
    if (zero && align == 0) fill = "0", align = '=';
    if (align == '=') {  // padding between the sign and the digits
      const size_t s = text[0] == '-' || text[0] == '+' || text[0] == ' ' ? 1 : 0;
      const std::string body = text.substr(s);
      out += text.substr(0, s) + Pad(body, width - static_cast<int64_t>(s), '>', fill);
    } else {
      out += Pad(text, width, align ? align : '>', fill);
    }
  }
  if (budget != nullptr) {
    if (auto st = budget->Charge(out.size()); !st.ok()) return st;
  }
  return Value(Json(std::move(out)));
}

}  // namespace tandem::chat_template
