#pragma once

// Values of the chat-template interpreter (chat_template.h): JSON data (the messages and other
// variables), plus what Jinja adds on top: undefined, namespaces (mutable objects) and callables
// (macros and global functions).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::chat_template {

using Json = nlohmann::ordered_json;

class Value;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kData, kNamespace, kCallable };

  Value() = default;  // undefined
  explicit Value(Json data) : kind_(Kind::kData), data_(std::move(data)) {}
  static Value Namespace(Json object);
  static Value Callable(Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_data() const { return kind_ == Kind::kData; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_string() const { return is_data() && data_.is_string(); }
  bool is_number() const { return is_data() && data_.is_number(); }
  bool is_none() const { return is_data() && data_.is_null(); }
  bool is_array() const { return is_data() && data_.is_array(); }
  bool is_object() const { return is_data() && data_.is_object(); }

  // Data (null for undefined; the namespace's attributes for a namespace).
  const Json& data() const;
  Json& mutable_namespace() { return *ns_; }
  const Function& function() const { return *fn_; }

  // Python truthiness: undefined, none, false, 0, "", [] and {} are false.
  bool Truthy() const;
  // What `{{ value }}` prints: Python's str() (None, True, ['a', 1], {'k': 'v'}).
  std::string ToString() const;

 private:
  Kind kind_ = Kind::kUndefined;
  Json data_;
  std::shared_ptr<Json> ns_;
  std::shared_ptr<Function> fn_;
};

// Python's repr() of JSON data: strings quoted, True/False/None, lists and dicts.
std::string PythonRepr(const Json& value);
// Python's str() of JSON data (strings unquoted at the top level).
std::string PythonStr(const Json& value);
// Python's json.dumps(value, ensure_ascii=False, indent=indent) (indent < 0: none), which is
// what Hugging Face's tojson filter produces: ", " and ": " separators, keys in insertion order.
std::string PythonJsonDumps(const Json& value, int indent);

// Python equality of data (1 == 1.0, True == 1, deep for lists and dicts).
bool DataEquals(const Json& a, const Json& b);

// UTF-8 helpers: code points of `s` (invalid bytes become U+FFFD) and back.
std::vector<uint32_t> DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace tandem::chat_template
