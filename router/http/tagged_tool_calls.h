#pragma once

// Tool calls in the tagged formats of newer model families (tool_parsers.h dispatches here):
//
//   qwen3_coder  Qwen3-Coder:  <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>
//                              ...</function>\n</tool_call> (also without the <tool_call> wrapper)
//   glm45        GLM-4.5/4.6:  <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE
//                              </arg_value>...</tool_call>
//   minimax_m2   MiniMax-M2:   <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">
//                              VALUE</parameter>...</invoke>...</minimax:tool_call>
//   kimi_k2      Kimi-K2:      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//                              <|tool_call_argument_begin|>{JSON}<|tool_call_end|>...
//                              <|tool_calls_section_end|>
//
// The first three write each parameter's value as text; it becomes JSON by the type the tool's
// JSON Schema gives the parameter, as vLLM's parsers of the same names convert it: a string type
// keeps the text; integer, number and boolean types parse it (the text when it does not); object,
// array and untyped parameters read it as JSON, then as a Python literal, else keep the text;
// "null" is null for a parameter that is not a string. Their arguments are therefore known once
// a call is complete (ToolCallPart::streamable false). Kimi-K2's arguments are the model's JSON
// (streamed as written) and its call id ("functions.NAME:IDX") is the call's id.

#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "router/http/tool_parsers.h"

namespace tandem {

enum class TaggedFormat { kQwen3Coder, kGlm45, kMinimaxM2, kKimiK2 };

// `parameters`: the request's tools, name -> JSON Schema of its parameters (null: no schemas,
// every value untyped). A call to a name not in `tools` is malformed.
ToolCallParse ParseTaggedToolCalls(TaggedFormat format, std::string_view text, bool final,
                                   const std::vector<std::string>& tools,
                                   const nlohmann::ordered_json* parameters);

// The JSON value of a parameter's text, by the type `schema` (the parameter's JSON Schema, or
// null) gives it. `untyped_as_json`: a parameter without a schema is read as JSON, then as a
// Python literal (GLM's parser); otherwise it stays a string.
nlohmann::ordered_json TypedArgumentValue(const std::string& text,
                                          const nlohmann::ordered_json* schema,
                                          bool untyped_as_json);

}  // namespace tandem
