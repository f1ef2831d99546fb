#include "common/tokenizer/chat_template_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::chat_template {
namespace {

const Json& NullJson() {
  static const Json* null = new Json();
  return *null;
}

// Python's repr() of a float: the shortest string that round-trips, with ".0" for integers.
std::string FloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  // Python switches to exponent notation at 1e16 and below 1e-4; to_chars picks the shorter.
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e16 || a < 1e-4)) {
    auto [e2, ec2] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    s.assign(buf, e2);
    // Python writes 1e+16, C++ 1e+16 as well; but Python keeps at least two exponent digits.
    const size_t epos = s.find('e');
    if (epos != std::string::npos && s.size() - epos == 3) s.insert(epos + 2, "0");
    return s;
  }
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

void ReprString(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out->push_back('\\');
          out->push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back(quote);
}

void Repr(const Json& v, std::string* out) {
  switch (v.type()) {
    case Json::value_t::null:
      *out += "None";
      return;
    case Json::value_t::boolean:
      *out += v.get<bool>() ? "True" : "False";
      return;
    case Json::value_t::number_integer:
      *out += std::to_string(v.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      *out += std::to_string(v.get<uint64_t>());
      return;
    case Json::value_t::number_float:
      *out += FloatRepr(v.get<double>());
      return;
    case Json::value_t::string:
      ReprString(v.get_ref<const std::string&>(), out);
      return;
    case Json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const Json& e : v) {
        if (!first) *out += ", ";
        first = false;
        Repr(e, out);
      }
      out->push_back(']');
      return;
    }
    case Json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        ReprString(it.key(), out);
        *out += ": ";
        Repr(it.value(), out);
      }
      out->push_back('}');
      return;
    }
    default:
      *out += "None";
  }
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void Dumps(const Json& v, int indent, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.type()) {
    case Json::value_t::null:
      *out += "null";
      return;
    case Json::value_t::boolean:
      *out += v.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double d = v.get<double>();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FloatRepr(d);
      return;
    }
    case Json::value_t::string:
      JsonString(v.get_ref<const std::string&>(), out);
      return;
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool is_array = v.is_array();
      out->push_back(is_array ? '[' : '{');
      if (v.empty()) {
        out->push_back(is_array ? ']' : '}');
        return;
      }
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        if (!is_array) {
          JsonString(it.key(), out);
          *out += ": ";
        }
        Dumps(it.value(), indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out->push_back(is_array ? ']' : '}');
      return;
    }
    default:
      Repr(v, out);  // integers
  }
}

}  // namespace

Value Value::Namespace(Json object) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::make_shared<Json>(std::move(object));
  return v;
}

Value Value::Callable(Function fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

const Json& Value::data() const {
  if (kind_ == Kind::kData) return data_;
  if (kind_ == Kind::kNamespace) return *ns_;
  return NullJson();
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
      return false;
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
    case Kind::kData:
      break;
  }
  switch (data_.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return data_.get<bool>();
    case Json::value_t::number_integer:
      return data_.get<int64_t>() != 0;
    case Json::value_t::number_unsigned:
      return data_.get<uint64_t>() != 0;
    case Json::value_t::number_float:
      return data_.get<double>() != 0.0;
    case Json::value_t::string:
      // nlohmann's empty() is false for every scalar, strings included.
      return !data_.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !data_.empty();
    default:
      return false;
  }
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNamespace:
      return "<Namespace " + PythonRepr(*ns_) + ">";
    case Kind::kCallable:
      return "<function>";
    case Kind::kData:
      break;
  }
  return PythonStr(data_);
}

std::string PythonRepr(const Json& value) {
  std::string out;
  Repr(value, &out);
  return out;
}

std::string PythonStr(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  return PythonRepr(value);
}

std::string PythonJsonDumps(const Json& value, int indent) {
  std::string out;
  Dumps(value, indent, 0, &out);
  return out;
}

bool DataEquals(const Json& a, const Json& b) {
  const bool an = a.is_number() || a.is_boolean();
  const bool bn = b.is_number() || b.is_boolean();
  if (an && bn) {
    auto num = [](const Json& j) -> double {
      return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
    };
    if (a.is_number_float() || b.is_number_float()) return num(a) == num(b);
    auto i = [](const Json& j) -> int64_t {
      return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>();
    };
    return i(a) == i(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!DataEquals(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !DataEquals(it.value(), *other)) return false;
    }
    return true;
  }
  return a == b;
}

std::vector<uint32_t> DecodeUtf8(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(0xfffd);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &out);
  return out;
}

}  // namespace tandem::chat_template
