#include "common/tokenizer/chat_template_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <random>

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
      if (const CallableTable* t = CallableTable::Current(); t != nullptr && t->Find(v)) {
        *out += "<function>";  // a callable's handle
        return;
      }
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        Repr(KeyValue(it.key()), out);
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

// The short escape json.dumps writes for c, or null.
const char* ShortEscape(uint32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return nullptr;
  }
}

// A JSON string as Python's json.dumps writes it: '"', '\\' and control characters escaped;
// with ensure_ascii every character outside ' '..'~' as \uXXXX (UTF-16 surrogate pairs).
void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  auto hex4 = [out](uint32_t u) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04x", u);
    *out += buf;
  };
  out->push_back('"');
  if (ensure_ascii) {
    for (uint32_t c : DecodeUtf8(s)) {
      if (const char* e = ShortEscape(c)) {
        *out += e;
      } else if (c >= 0x20 && c < 0x7f) {
        out->push_back(static_cast<char>(c));
      } else if (c < 0x10000) {
        hex4(c);
      } else {
        hex4(0xd800 + ((c - 0x10000) >> 10));
        hex4(0xdc00 + ((c - 0x10000) & 0x3ff));
      }
    }
  } else {
    for (unsigned char c : s) {
      if (const char* e = ShortEscape(c)) {
        *out += e;
      } else if (c < 0x20) {
        hex4(c);
      } else {
        out->push_back(static_cast<char>(c));
      }
    }
  }
  out->push_back('"');
}

void Dumps(const Json& v, const JsonDumpsOptions& o, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int k = 0; k < lvl; ++k) *out += *o.indent;
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
      JsonString(v.get_ref<const std::string&>(), o.ensure_ascii, out);
      return;
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool is_array = v.is_array();
      out->push_back(is_array ? '[' : '{');
      if (v.empty()) {
        out->push_back(is_array ? ']' : '}');
        return;
      }
      std::vector<Json::const_iterator> items;
      for (auto it = v.begin(); it != v.end(); ++it) items.push_back(it);
      if (!is_array && o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.key() < b.key(); });
      }
      bool first = true;
      for (const auto& it : items) {
        if (!first) *out += o.item_separator;
        first = false;
        if (o.indent) newline(level + 1);
        if (!is_array) {
          const Json key = KeyValue(it.key());  // json.dumps writes 512 as "512"
          JsonString(key.is_string() ? key.get<std::string>() : key.dump(), o.ensure_ascii, out);
          *out += o.key_separator;
        }
        Dumps(it.value(), o, level + 1, out);
      }
      if (o.indent) newline(level);
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

Value::Value(Json data) : kind_(Kind::kData), data_(std::move(data)) {
  if (!data_.is_object() || data_.size() != 1) return;
  if (CallableTable* table = CallableTable::Current()) {
    if (std::shared_ptr<Function> fn = table->Find(data_)) {
      kind_ = Kind::kCallable;
      fn_ = std::move(fn);
    }
  }
}

Value Value::Callable(Function fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  if (CallableTable* table = CallableTable::Current()) v.data_ = table->Add(v.fn_);
  return v;
}

namespace {
thread_local CallableTable* current_table = nullptr;
}  // namespace

CallableTable::CallableTable() : previous_(current_table) {
  std::random_device random;
  char buf[48];
  std::snprintf(buf, sizeof buf,
                "\x01"
                "callable:%08x%08x%08x%08x",
                random(), random(), random(), random());
  key_ = buf;
  current_table = this;
}

CallableTable::~CallableTable() { current_table = previous_; }

CallableTable* CallableTable::Current() { return current_table; }

Json CallableTable::Add(std::shared_ptr<Function> fn) {
  functions_.push_back(std::move(fn));
  return Json::object({{key_, functions_.size() - 1}});
}

std::shared_ptr<Function> CallableTable::Find(const Json& handle) const {
  auto it = handle.find(key_);
  if (it == handle.end() || !it->is_number_unsigned()) return nullptr;
  const uint64_t i = it->get<uint64_t>();
  return i < functions_.size() ? functions_[i] : nullptr;
}

std::string DictKey(const Json& key) {
  if (key.is_string()) return key.get<std::string>();
  return "\x02" + key.dump();
}

Json KeyValue(const std::string& stored) {
  if (stored.empty() || stored[0] != '\x02') return Json(stored);
  Json v = Json::parse(stored.begin() + 1, stored.end(), nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? Json(stored) : v;
}

const Json& Value::data() const {
  if (kind_ == Kind::kData || kind_ == Kind::kCallable) return data_;
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

std::string PythonJsonDumps(const Json& value, const JsonDumpsOptions& options) {
  std::string out;
  Dumps(value, options, 0, &out);
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
