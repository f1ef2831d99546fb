#pragma once

// Tool-call parsers, one per model family's call format (vLLM's --tool-call-parser names), over
// the answer part of a chat output (after any reasoning block). A parse reads the whole text so
// far: the content before the calls, the calls (complete or still forming: name known, arguments
// text growing) and, once the output has ended, the text after them. The streaming side
// (chat_output.h) diffs successive parses into OpenAI's deltas; a non-streamed response takes
// the final parse. Pure functions; no I/O.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

enum class ToolCallParser {
  kJson,        // no family marker: a JSON call object or array, or one in a ```json fence
  kHermes,      // Qwen2.5/3, Hermes 2 Pro/3, QwQ: <tool_call>\n{"name", "arguments"}\n</tool_call>
  kLlama3Json,  // Llama 3.1/3.2/3.3: [<|python_tag|>]{"name", "parameters"} (';' between calls),
                // and the pythonic list Llama 3.2/3.3 also write
  kPythonic,    // Llama 3.2 pythonic / Llama 4: [get_weather(city="Paris"), ...]
  kMistral,     // [TOOL_CALLS][{"name", "arguments"}, ...] (v0.3) or
                // [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} / [TOOL_CALLS]name[ARGS]{...} (v11+)
  kPhi4MiniJson,  // Phi-4-mini: functools[{"name", "arguments"}, ...]
  kDeepSeekV3,  // DeepSeek V3/R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>
                // name\n```json\n{...}\n```<｜tool▁call▁end｜>...; V3.1's name<｜tool▁sep｜>{...}
  // Tagged formats (tagged_tool_calls.h): parameters typed by the tools' schemas, or (Kimi) JSON.
  kQwen3Coder,  // Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
  kGlm45,       // GLM-4.5/4.6: <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>
  kMinimaxM2,   // MiniMax-M2: <minimax:tool_call><invoke name="NAME"><parameter name="KEY">...
  kKimiK2,      // Kimi-K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0...
};

// vLLM's names: hermes, llama3_json (also llama4_json), pythonic (also llama4_pythonic),
// mistral, phi4_mini_json, deepseek_v3, deepseek_v31, qwen3_coder, glm45 (also glm4_moe),
// minimax_m2, kimi_k2, and "json" for the generic parser.
absl::StatusOr<ToolCallParser> ToolCallParserByName(std::string_view name);
const char* ToolCallParserName(ToolCallParser parser);
// The parser a chat template's call format implies (kJson when it names none).
ToolCallParser ToolCallParserOfTemplate(std::string_view template_source);

// One call, complete or forming.
struct ToolCallPart {
  std::string id;         // the model's own call id (Mistral [CALL_ID]); usually empty
  std::string name;       // empty until the whole name was read
  std::string arguments;  // JSON text of the arguments object, as far as it was generated
  // The arguments text only grows (it is the model's own JSON, streamed as generated); false
  // when it is known only once the call is complete (pythonic, arguments given as a string).
  bool streamable = true;
  bool complete = false;
};

struct ToolCallParse {
  // The text before the first call (while streaming: the part that can no longer become one).
  std::string content;
  std::vector<ToolCallPart> calls;
  // After the calls (final parse only): what the model wrote after them.
  std::string trailing;
  // Final parse only: the output started a call that did not parse (bad JSON, an unknown tool,
  // cut off). The whole text is then content and `calls` is empty.
  bool malformed = false;
};

// Parses `text` (the answer so far; `final`: the output has ended). `tools`: the request's tool
// names (a call to any other name is malformed); `parameters`: name -> the tool's parameters
// schema, which types the values of the tagged formats (null: untyped).
ToolCallParse ParseToolCallText(ToolCallParser parser, std::string_view text, bool final,
                                const std::vector<std::string>& tools,
                                const nlohmann::ordered_json* parameters = nullptr);

// Python literal (the pythonic format's argument values: strings, numbers, True/False/None,
// lists, tuples, dicts) as JSON text; nullopt when `text` is not one.
std::optional<std::string> PythonLiteralToJson(std::string_view text);

}  // namespace tandem
