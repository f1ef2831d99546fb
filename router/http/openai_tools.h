#pragma once

// OpenAI structured output and tool calling on the HTTP API: response_format, vLLM's guided_*
// fields and tools/tool_choice turned into the Generation API's OutputConstraint, and generated
// text turned back into message.tool_calls. Pure functions; no I/O.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/sampling.pb.h"

namespace tandem {

// How a model family writes tool calls, read from its chat template: the constrained output of
// tool_choice "required" follows it and call ids take the family's shape.
enum class ToolCallFormat {
  kJsonArray,  // [{"name", "arguments"}, ...]: generic, and what Mistral writes after [TOOL_CALLS]
  kHermes,     // Qwen2/2.5/3 and Hermes: <tool_call>\n{"name", "arguments"}\n</tool_call> blocks
  kLlama,      // Llama 3.1/3.2: one {"name", "parameters"} object per turn
};

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
    nlohmann::json parameters;  // JSON Schema (an object); {} when absent
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
absl::StatusOr<ToolCallOptions> ParseToolOptions(const nlohmann::json& body);

// Sets `constraint` from response_format, guided_json / guided_regex / guided_grammar /
// guided_choice and the tool choice (at most one of them may constrain).
absl::Status ConvertOutputConstraint(const nlohmann::json& body, const ToolCallOptions& tools,
                                     v1::OutputConstraint* constraint);

// The grammar (text form) for tool_choice "required", in `tools.format`: one call or (parallel)
// up to max(4, number of tools), each {"name": <a tool>, "arguments": <its parameters>} (a JSON
// array; or <tool_call> blocks; Llama: one {"name", "parameters"} object, as its template
// renders a single call per turn).
absl::StatusOr<std::string> RequiredToolCallGrammar(const ToolCallOptions& tools);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON text
};

// The calls in a finished output, or nullopt when the text is not a tool call (auto: the model
// answered in text). Accepts the JSON forms above, optionally wrapped as <tool_call>...</tool_call>
// (Qwen) or after [TOOL_CALLS] (Mistral) or <|python_tag|> (Llama), with "parameters" for
// "arguments" (Llama 3.1).
std::optional<std::vector<ParsedToolCall>> ParseToolCalls(const ToolCallOptions& tools,
                                                          const std::string& text);

// OpenAI's tool_calls array; `id_base` makes the call ids ("call_<id_base>_<i>", or with
// short_ids 9 alphanumeric characters derived from it, as Mistral's template requires). stream:
// each element also carries its "index".
nlohmann::json ToolCallsJson(const std::vector<ParsedToolCall>& calls, const std::string& id_base,
                             bool stream, bool short_ids = false);

}  // namespace tandem
