#pragma once

// OpenAI structured output and tool calling on the HTTP API: response_format, vLLM's guided_*
// fields and tools/tool_choice turned into the Generation API's OutputConstraint (generated
// text becomes message.tool_calls in chat_output.h, by the family's parser in tool_parsers.h).
// Request JSON is order-preserving (nlohmann::ordered_json): schemas keep the client's key order.
// Pure functions; no I/O.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/http/tool_parsers.h"
#include "tandem/v1/sampling.pb.h"

namespace tandem {

// The shape of tool_choice "required" output, from the family's parser: what its models write.
enum class ToolCallFormat {
  kJsonArray,  // [{"name", "arguments"}, ...]: generic, and what Mistral writes after [TOOL_CALLS]
  kHermes,     // Qwen2/2.5/3 and Hermes: <tool_call>\n{"name", "arguments"}\n</tool_call> blocks
  kLlama,      // Llama 3.1/3.2: one {"name", "parameters"} object per turn
};
ToolCallFormat ToolCallFormatOf(ToolCallParser parser);
// The parser that reads the "required" output of `format` back (the family's when it writes
// that format itself, else the generic JSON one).
ToolCallParser RequiredOutputParser(ToolCallFormat format, ToolCallParser family);

// The format a chat template's source implies (kJsonArray when it names none). Mistral templates
// also want 9-character alphanumeric call ids (MistralCallIds).
ToolCallFormat ToolCallFormatOfTemplate(std::string_view template_source);
bool MistralCallIds(std::string_view template_source);

struct ToolCallOptions {
  enum class Choice {
    kNone,      // no tools, or tool_choice "none": plain text
    kAuto,      // the model decides; output is parsed for a tool call afterwards
    kRequired,  // constrained: a JSON array of calls, [{"name": ..., "arguments": {...}}, ...]
    kNamed,     // constrained: the named function's arguments object
  };
  struct Tool {
    std::string name;
    nlohmann::ordered_json parameters;  // JSON Schema (an object); {} when absent
  };
  Choice choice = Choice::kNone;
  std::string named;
  std::vector<Tool> tools;
  bool parallel = true;  // parallel_tool_calls
  ToolCallFormat format = ToolCallFormat::kJsonArray;
  bool short_ids = false;  // call ids of 9 alphanumeric characters (Mistral)

  bool returns_calls() const { return choice != Choice::kNone; }
};

// Reads tools, tool_choice and parallel_tool_calls (chat). INVALID_ARGUMENT names the field.
absl::StatusOr<ToolCallOptions> ParseToolOptions(const nlohmann::ordered_json& body);

// Sets `constraint` from response_format, guided_json / guided_regex / guided_grammar /
// guided_choice and the tool choice (at most one of them may constrain).
absl::Status ConvertOutputConstraint(const nlohmann::ordered_json& body,
                                     const ToolCallOptions& tools,
                                     v1::OutputConstraint* constraint);

// The grammar (text form) for tool_choice "required", in `tools.format`: one call or (parallel)
// up to max(4, number of tools), each {"name": <a tool>, "arguments": <its parameters>} (a JSON
// array; or <tool_call> blocks; Llama: one {"name", "parameters"} object, as its template
// renders a single call per turn).
absl::StatusOr<std::string> RequiredToolCallGrammar(const ToolCallOptions& tools);

}  // namespace tandem
