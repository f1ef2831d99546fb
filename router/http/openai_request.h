#pragma once

// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) turned into the Generation
// API's GenerateRequest. Only the mapping lives here: the request then goes through the same
// validation as a gRPC client's (router/generate_call.cc), so both APIs accept and refuse the
// same things with the same messages. Pure functions over bytes: the fuzz target
// (tests/fuzz/http/openai_request_fuzzer.cc) feeds them arbitrary input.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/http/openai_tools.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

class ChatTemplate;
class Tokenizer;

struct OpenAiLimits {
  int32_t max_json_depth = 64;
  int32_t max_messages = 4096;
  // chat_template_kwargs: keys, and bytes of the whole object serialised.
  int32_t max_template_kwargs = 64;
  int32_t max_template_kwargs_bytes = 64 << 10;
};

// Parses a request body: a JSON object, nested at most `max_json_depth` deep. INVALID_ARGUMENT
// with the parser's message (and byte offset) for anything else; never throws.
absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body, const OpenAiLimits& limits);

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// What the HTTP layer needs besides the GenerateRequest.
struct OpenAiRequest {
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // chat: logprobs; completions: logprobs set
  std::string user;            // OpenAI's end-user id (logged)
  ToolCallOptions tools;       // chat: tools and tool_choice (the responder builds tool_calls)
};

// Context of the conversion: the tokenizer (its BOS/EOS tokens for the template, and to tokenize
// chat prompts) and the chat template (null for completions-only use).
struct OpenAiContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  int32_t max_model_len = 0;  // chat default max_tokens: what is left of the context
  OpenAiLimits limits;
};

// INVALID_ARGUMENT naming the parameter ("temperature: must be a number") for a body OpenAI's
// schema would refuse, and for parameters Tandem does not implement (echo, best_of > 1,
// suffix, functions). response_format, guided_* and tools/tool_choice become the request's
// OutputConstraint (openai_tools.h).
absl::StatusOr<OpenAiRequest> ConvertOpenAiRequest(OpenAiEndpoint endpoint,
                                                   const nlohmann::json& body,
                                                   const OpenAiContext& context);

// Renders a chat request's messages through the template (add_generation_prompt true), with
// `tools` (the request's tools list, may be null) and assistant tool_calls / tool messages.
// `template_kwargs` (vLLM's chat_template_kwargs, may be null): an object whose keys become
// template variables (Qwen3's enable_thinking); INVALID_ARGUMENT for a non-object, past the
// limits, or for a key the request itself sets (messages, tools,
// bos_token, eos_token, add_generation_prompt).
absl::StatusOr<std::string> RenderChatPrompt(const nlohmann::json& messages,
                                             const OpenAiContext& context,
                                             const nlohmann::json* tools = nullptr,
                                             const nlohmann::json* template_kwargs = nullptr);

}  // namespace tandem
