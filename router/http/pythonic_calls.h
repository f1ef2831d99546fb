#pragma once

// The pythonic tool-call format (Llama 3.2/3.3/4: `[get_weather(city="Paris"), add(a=1)]`):
// a list of calls with keyword arguments whose values are Python literals, turned into JSON
// arguments. Pure functions, used by tool_parsers.cc.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/http/tool_parsers.h"

namespace tandem {

// Where a parse of a calls region stands.
enum class CallRegion {
  kPartial,   // the text ended inside it (more may come)
  kDone,      // complete; *end is one past it
  kError,     // it started as calls but does not parse (or calls an unknown tool)
  kNotCalls,  // the text there is no call list at all (ordinary content)
};

// `s[pos]` is '['. Appends each call as it forms (its name once `name(` was read; its
// arguments, as JSON, once its `)` was).
CallRegion ParsePythonicCalls(std::string_view s, size_t pos, bool final,
                              const std::vector<std::string>& tools,
                              std::vector<ToolCallPart>* calls, size_t* end);

}  // namespace tandem
