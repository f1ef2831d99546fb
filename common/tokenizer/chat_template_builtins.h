#pragma once

// Operators, filters, tests and methods of the chat-template interpreter, with Python's
// semantics where Jinja defers to Python (truthiness, slicing, str methods, json.dumps).

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template_value.h"

namespace tandem::chat_template {

// What one rendering may spend: evaluation steps and bytes of strings it builds. Exhausting
// either fails the rendering (RESOURCE_EXHAUSTED), so no template or input can hang or blow up.
struct Budget {
  int64_t steps = 1'000'000;
  int64_t bytes = 256 << 20;
  size_t max_string = 16 << 20;  // longest string one operation may produce

  absl::Status Step() {
    if (--steps >= 0) return absl::OkStatus();
    return absl::ResourceExhaustedError("chat template: evaluation step limit reached");
  }
  absl::Status Charge(size_t n);
};

// a op b for + - * / // % ** ~ == != < <= > >= in "not in".
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               Budget* budget);
// obj.name (dict keys, namespace attributes); undefined when absent.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key] (dict keys, list and string indices, negative from the end); undefined when absent.
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or string (unset parts are undefined values).
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step);
// Items a for loop visits: list elements, dict keys, string characters; none for undefined.
absl::StatusOr<std::vector<Json>> Iterate(const Value& v);

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs& args,
                                  Budget* budget);
// sort, dictsort, unique, select, reject, selectattr, rejectattr, map
// (chat_template_list_filters.cc); NOT_FOUND for another name.
absl::StatusOr<Value> ApplyListFilter(absl::string_view name, const Value& input, CallArgs& args,
                                      Budget* budget);
// Jinja's attribute argument of filters: "a.b.0" looks up each dot-separated part in turn
// (digits as list indices); undefined when a part is absent.
Value GetAttrPath(const Value& obj, const std::string& path);
// Python's string formatting (chat_template_format.cc): `format % args` (a list with one item
// per conversion is the arguments, as a tuple would be; a dict feeds %(name)s) and
// format.format(*args, **kwargs) with the format-spec mini-language.
absl::StatusOr<Value> PercentFormat(const std::string& format, const Value& args, Budget* budget);
absl::StatusOr<Value> StrFormat(const std::string& format, const CallArgs& args, Budget* budget);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, CallArgs& args);
// obj.name(args) for str, dict and list methods; NOT_FOUND when there is no such method.
absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, CallArgs& args,
                                 Budget* budget);

// Helpers shared by the builtins.
absl::Status TypeError(absl::string_view message);
// Positional argument i, else keyword `name`, else undefined.
Value Arg(const CallArgs& args, size_t i, absl::string_view name);
// Python's str.strip family: `mode` 'b'oth, 'l'eft, 'r'ight; chars undefined/none: whitespace.
std::string Strip(const std::string& s, const Value& chars, char mode);
// Argument i (or `name`) as a string (a TypeError naming `what` otherwise), or as an integer
// (`fallback` when it is not a number).
absl::StatusOr<std::string> StringArg(const CallArgs& args, size_t i, absl::string_view name,
                                      absl::string_view what);
int64_t IntArg(const CallArgs& args, size_t i, absl::string_view name, int64_t fallback);
// Python's str.isspace() of one character, and str.splitlines(): the lines without their ends
// (\n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029).
bool IsPySpace(uint32_t c);
std::vector<std::string> SplitLines(const std::string& s);

}  // namespace tandem::chat_template
