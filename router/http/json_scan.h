#pragma once

// Scanning JSON text that may still be growing (a model's output, token by token): where a value
// ends, whether it is complete yet, and the members of a tool-call object as far as they were
// written. Used by the tool-call parsers (tool_parsers.h). Pure functions.

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

// Skips JSON whitespace from `pos`.
size_t SkipJsonSpace(std::string_view s, size_t pos);

struct JsonValueScan {
  size_t end = 0;         // one past the value (or s.size() while incomplete)
  bool complete = false;  // the value ended within `s`
  bool error = false;     // `s` at `pos` cannot start or continue a JSON value
};
// The extent of the JSON value starting at `pos` (its first character). A number or literal at
// the very end of `s` is complete only when `final`. Validates structure loosely (brackets and
// strings); a complete value is checked by parsing it.
JsonValueScan ScanJsonValue(std::string_view s, size_t pos, bool final);

// A call object {"name": ..., "arguments": ...} ("parameters" for "arguments", as Llama writes)
// as far as it was written.
struct JsonCallScan {
  size_t end = 0;  // one past the closing brace, when complete
  bool complete = false;
  bool error = false;
  std::string name;  // set once the name's string is complete
  bool has_name = false;
  // The arguments value: [args_begin, args_end) so far.
  bool has_args = false;
  size_t args_begin = 0;
  size_t args_end = 0;
  bool args_complete = false;
};
// `pos` is at the object's '{'.
JsonCallScan ScanJsonCall(std::string_view s, size_t pos, bool final);

// The longest suffix of `text` that is a proper prefix of `marker` (a marker that may be
// forming at the end of a streamed text).
size_t PartialMarkerSuffix(std::string_view text, std::string_view marker);

}  // namespace tandem
