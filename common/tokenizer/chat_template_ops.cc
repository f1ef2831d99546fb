// Operators, attribute / item access and slicing of the chat-template interpreter.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_builtins.h"

namespace tandem::chat_template {
namespace {

bool IsNumeric(const Json& j) { return j.is_number() || j.is_boolean(); }
bool IsIntegral(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t AsInt(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }
double AsDouble(const Json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
}

const char* TypeName(const Value& v) {
  if (v.is_undefined()) return "undefined";
  if (v.is_namespace()) return "namespace";
  if (v.is_callable()) return "function";
  const Json& j = v.data();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number_float()) return "float";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

absl::Status Unsupported(absl::string_view op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand types for ", op, ": '", TypeName(a), "' and '",
                                TypeName(b), "'"));
}

absl::StatusOr<Value> Arithmetic(absl::string_view op, const Json& x, const Json& y) {
  if (IsIntegral(x) && IsIntegral(y) && op != "/") {
    const int64_t a = AsInt(x), b = AsInt(y);
    int64_t r = 0;
    if (op == "+") {
      if (__builtin_add_overflow(a, b, &r)) return TypeError("integer overflow");
    } else if (op == "-") {
      if (__builtin_sub_overflow(a, b, &r)) return TypeError("integer overflow");
    } else if (op == "*") {
      if (__builtin_mul_overflow(a, b, &r)) return TypeError("integer overflow");
    } else if (op == "//" || op == "%") {
      if (b == 0) return TypeError("integer division or modulo by zero");
      if (a == INT64_MIN && b == -1) return TypeError("integer overflow");
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        --q;
        m += b;
      }
      r = op == "//" ? q : m;
    } else {  // **
      if (b < 0) return Value(Json(std::pow(static_cast<double>(a), static_cast<double>(b))));
      r = 1;
      for (int64_t i = 0; i < b; ++i) {
        if (__builtin_mul_overflow(r, a, &r)) return TypeError("integer overflow");
        if (r == 0 || r == 1) break;
      }
    }
    return Value(Json(r));
  }
  const double a = AsDouble(x), b = AsDouble(y);
  if (op == "+") return Value(Json(a + b));
  if (op == "-") return Value(Json(a - b));
  if (op == "*") return Value(Json(a * b));
  if (op == "**") return Value(Json(std::pow(a, b)));
  if (b == 0) return TypeError("float division by zero");
  if (op == "/") return Value(Json(a / b));
  const double q = std::floor(a / b);
  return Value(Json(op == "//" ? q : a - q * b));
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  const Json& x = a.data();
  const Json& y = b.data();
  if (a.is_data() && b.is_data() && IsNumeric(x) && IsNumeric(y)) {
    const double p = AsDouble(x), q = AsDouble(y);
    return p < q ? -1 : p > q ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = x.get_ref<const std::string&>().compare(y.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {  // lexicographic, as Python compares lists
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!DataEquals(x[i], y[i])) return Compare(Value(x[i]), Value(y[i]));
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return TypeError(
      absl::StrCat("'<' not supported between '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  const Json& c = container.data();
  if (container.is_undefined()) return false;
  if (c.is_string()) {
    if (!item.is_string()) return TypeError("'in <string>' requires a string as left operand");
    return c.get_ref<const std::string&>().find(item.data().get_ref<const std::string&>()) !=
           std::string::npos;
  }
  if (c.is_array()) {
    for (const Json& e : c) {
      if (DataEquals(e, item.data())) return true;
    }
    return false;
  }
  if (c.is_object()) return item.is_data() && c.contains(DictKey(item.data()));
  return TypeError(absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
}

// Python's slice.indices(): normalized start, stop, step for a sequence of length n.
absl::Status SliceIndices(const Value& start, const Value& stop, const Value& step, int64_t n,
                          int64_t* b, int64_t* e, int64_t* s) {
  auto get = [](const Value& v, int64_t* out) -> absl::Status {
    if (v.is_undefined() || v.is_none()) return absl::OkStatus();
    if (!v.is_data() || !IsIntegral(v.data())) return TypeError("slice indices must be integers");
    *out = AsInt(v.data());
    return absl::OkStatus();
  };
  *s = 1;
  if (auto st = get(step, s); !st.ok()) return st;
  if (*s == 0) return TypeError("slice step cannot be zero");
  *b = *s > 0 ? 0 : n - 1;
  *e = *s > 0 ? n : -1;
  int64_t v;
  auto clamp = [&](int64_t x, bool is_stop) {
    if (x < 0) x += n;
    if (*s > 0) return std::max<int64_t>(0, std::min(x, n));
    return std::max<int64_t>(-1, std::min(x, n - 1));
  };
  if (!start.is_undefined() && !start.is_none()) {
    if (auto st = get(start, &v); !st.ok()) return st;
    *b = clamp(v, false);
  }
  if (!stop.is_undefined() && !stop.is_none()) {
    if (auto st = get(stop, &v); !st.ok()) return st;
    *e = clamp(v, true);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Budget::Charge(size_t n) {
  if (n > max_string) {
    return absl::ResourceExhaustedError("chat template: a string grew beyond the size limit");
  }
  bytes -= static_cast<int64_t>(n);
  if (bytes >= 0) return absl::OkStatus();
  return absl::ResourceExhaustedError("chat template: rendering used too much memory");
}

absl::Status TypeError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template: ", message));
}

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               Budget* budget) {
  if (op == "%" && a.is_string()) return PercentFormat(a.data().get<std::string>(), b, budget);
  if (op == "==") return Value(Json(a.kind() == b.kind() && DataEquals(a.data(), b.data())));
  if (op == "!=") return Value(Json(!(a.kind() == b.kind() && DataEquals(a.data(), b.data()))));
  if (op == "in" || op == "not in") {
    auto in = Contains(b, a);
    if (!in.ok()) return in.status();
    return Value(Json(op == "in" ? *in : !*in));
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    auto c = Compare(a, b);
    if (!c.ok()) return c.status();
    const bool r = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
    return Value(Json(r));
  }
  if (op == "~") {
    std::string s = a.ToString() + b.ToString();
    if (auto st = budget->Charge(s.size()); !st.ok()) return st;
    return Value(Json(std::move(s)));
  }
  const Json& x = a.data();
  const Json& y = b.data();
  if (!a.is_data() || !b.is_data()) return Unsupported(op, a, b);
  if (IsNumeric(x) && IsNumeric(y)) return Arithmetic(op, x, y);
  if (op == "+" && x.is_string() && y.is_string()) {
    const size_t n =
        x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size();
    if (auto st = budget->Charge(n); !st.ok()) return st;
    return Value(Json(x.get<std::string>() + y.get<std::string>()));
  }
  if (op == "+" && x.is_array() && y.is_array()) {
    if (auto st = budget->Charge(16 * (x.size() + y.size())); !st.ok()) return st;
    Json r = x;
    for (const Json& e : y) r.push_back(e);
    return Value(std::move(r));
  }
  if (op == "*" && ((x.is_string() || x.is_array()) && IsIntegral(y))) {
    const int64_t times = std::max<int64_t>(0, AsInt(y));
    const size_t unit = x.is_string() ? x.get_ref<const std::string&>().size() : 16 * x.size();
    if (unit > 0 && static_cast<uint64_t>(times) > budget->max_string / unit) {
      return absl::ResourceExhaustedError("chat template: a string grew beyond the size limit");
    }
    if (auto st = budget->Charge(unit * times); !st.ok()) return st;
    if (x.is_string()) {
      std::string r;
      for (int64_t i = 0; i < times; ++i) r += x.get_ref<const std::string&>();
      return Value(Json(std::move(r)));
    }
    Json r = Json::array();
    for (int64_t i = 0; i < times; ++i) {
      for (const Json& e : x) r.push_back(e);
    }
    return Value(std::move(r));
  }
  if (op == "*" && IsIntegral(x) && (y.is_string() || y.is_array())) {
    return BinaryOp(op, b, a, budget);
  }
  return Unsupported(op, a, b);
}

Value GetAttr(const Value& obj, const std::string& name) {
  const Json& j = obj.data();
  // groupby's (grouper, list) pairs, Jinja's _GroupTuple: also read by name.
  if (obj.is_array() && j.size() == 2 && (name == "grouper" || name == "list")) {
    return Value(j[name == "grouper" ? 0 : 1]);
  }
  if ((obj.is_data() || obj.is_namespace()) && j.is_object()) {
    auto it = j.find(name);
    if (it != j.end()) return Value(*it);
  }
  return Value();
}

Value GetItem(const Value& obj, const Value& key) {
  const Json& j = obj.data();
  if (!obj.is_data() && !obj.is_namespace()) return Value();
  const Json& k = key.data();
  if (j.is_object()) return key.is_data() ? GetAttr(obj, DictKey(k)) : Value();
  if ((j.is_array() || j.is_string()) && key.is_data() && IsIntegral(k)) {
    int64_t i = AsInt(k);
    if (j.is_array()) {
      const int64_t n = static_cast<int64_t>(j.size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? Value(j[static_cast<size_t>(i)]) : Value();
    }
    const std::vector<uint32_t> cps = DecodeUtf8(j.get<std::string>());
    const int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value(Json(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1)));
  }
  return Value();
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step) {
  const Json& j = obj.data();
  if (!obj.is_data() || !(j.is_array() || j.is_string())) {
    return TypeError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  std::vector<uint32_t> cps;
  if (j.is_string()) cps = DecodeUtf8(j.get<std::string>());
  const int64_t n =
      j.is_string() ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(j.size());
  int64_t b, e, s;
  if (auto st = SliceIndices(start, stop, step, n, &b, &e, &s); !st.ok()) return st;
  Json out = j.is_string() ? Json("") : Json::array();
  std::string text;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) {
    if (j.is_string()) {
      AppendUtf8(cps[static_cast<size_t>(i)], &text);
    } else {
      out.push_back(j[static_cast<size_t>(i)]);
    }
  }
  if (j.is_string()) out = std::move(text);
  return Value(std::move(out));
}

absl::StatusOr<std::vector<Json>> Iterate(const Value& v) {
  std::vector<Json> items;
  if (v.is_undefined()) return items;
  const Json& j = v.data();
  if (j.is_array()) {
    items.assign(j.begin(), j.end());
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) items.push_back(KeyValue(it.key()));
  } else if (j.is_string()) {
    for (uint32_t cp : DecodeUtf8(j.get<std::string>())) {
      std::string c;
      AppendUtf8(cp, &c);
      items.emplace_back(std::move(c));
    }
  } else {
    return TypeError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
  return items;
}

}  // namespace tandem::chat_template
