#pragma once

// Values of the chat-template interpreter (chat_template.h): JSON data (the messages and other
// variables), plus what Jinja adds on top: undefined, namespaces (mutable objects) and callables
// (macros and global functions).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

  Value() = default;          // undefined
  explicit Value(Json data);  // a callable when `data` is a handle of the current table
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

  // Data (null for undefined; the namespace's attributes for a namespace; a callable's handle
  // in the current CallableTable, else null).
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

// Callables inside data (a macro kept in a list, a dict or a namespace, as AI21's Jamba template
// keeps them): while a table is current, a callable's data() is a handle (an object with one key
// private to the table), and a handle read back out of data is the callable again. The key is
// random, so input data cannot forge a handle. One table per rendering, current on its thread
// from construction to destruction.
class CallableTable {
 public:
  CallableTable();
  ~CallableTable();
  CallableTable(const CallableTable&) = delete;
  CallableTable& operator=(const CallableTable&) = delete;

  static CallableTable* Current();
  Json Add(std::shared_ptr<Function> fn);
  // The callable `handle` stands for; null when it is not one of this table's handles.
  std::shared_ptr<Function> Find(const Json& handle) const;

 private:
  std::string key_;
  std::vector<std::shared_ptr<Function>> functions_;
  CallableTable* previous_;
};

// Dict keys that are not strings (ByteDance Seed-OSS's template maps ints to ints): JSON objects
// key by string, so such a key is stored as "\x02" + its JSON ("\x02" "512"), and read back as
// that value wherever keys come out (iteration, items, dictsort, repr; tojson writes "512", as
// Python's json.dumps does).
std::string DictKey(const Json& key);      // strings as they are
Json KeyValue(const std::string& stored);  // the key DictKey stored

// Python's repr() of JSON data: strings quoted, True/False/None, lists and dicts.
std::string PythonRepr(const Json& value);
// Python's str() of JSON data (strings unquoted at the top level).
std::string PythonStr(const Json& value);
// Python's json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...), which
// Hugging Face's tojson filter calls (its defaults: ensure_ascii False, keys in insertion order).
struct JsonDumpsOptions {
  bool ensure_ascii = false;          // non-ASCII as \uXXXX escapes (surrogate pairs above BMP)
  std::optional<std::string> indent;  // unset: one line; set: a newline and this per level
  std::string item_separator = ", ";  // json.dumps' default, "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string PythonJsonDumps(const Json& value, const JsonDumpsOptions& options = {});

// Python equality of data (1 == 1.0, True == 1, deep for lists and dicts).
bool DataEquals(const Json& a, const Json& b);

// UTF-8 helpers: code points of `s` (invalid bytes become U+FFFD) and back.
std::vector<uint32_t> DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace tandem::chat_template
