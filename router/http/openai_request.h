#pragma once

// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) turned into the Generation
// API's GenerateRequest. Only the mapping lives here: the request then goes through the same
// validation as a gRPC client's (router/generate_call.cc), so both APIs accept and refuse the
// same things with the same messages. Pure functions over bytes: the fuzz target
// (tests/fuzz/http/openai_request_fuzzer.cc) feeds them arbitrary input.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/http/chat_output.h"
#include "router/http/chat_prompt.h"
#include "router/http/openai_tools.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

class ChatTemplate;
class Tokenizer;

struct OpenAiLimits {
  int32_t max_json_depth = 64;
  // Objects keep their keys in order (nlohmann::ordered_json), whose insertion is linear in an
  // object's keys: at most this many keys in one object, and this many key pairs (the sum over
  // objects of keys squared) in a body, so parsing stays linear in practice.
  int32_t max_object_keys = 4096;
  int64_t max_key_pairs = int64_t{1} << 24;
  int32_t max_messages = 4096;
  // chat_template_kwargs: keys, and bytes of the whole object serialised.
  int32_t max_template_kwargs = 64;
  int32_t max_template_kwargs_bytes = 64 << 10;
};

// Parses a request body: a JSON object, nested at most `max_json_depth` deep, its keys in the
// client's order (templates print tools and arguments as sent). INVALID_ARGUMENT with the
// parser's message (and byte offset) for anything else; never throws.
absl::StatusOr<nlohmann::ordered_json> ParseJsonBody(std::string_view body,
                                                     const OpenAiLimits& limits);

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// What the HTTP layer needs besides the GenerateRequest.
struct OpenAiRequest {
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // chat: logprobs; completions: logprobs set
  std::string user;            // OpenAI's end-user id (logged)
  ToolCallOptions tools;       // chat: tools and tool_choice
  // chat: how the output becomes reasoning_content, content and tool_calls (id_base is the
  // responder's to set).
  ChatOutputOptions chat;
  bool return_token_ids = false;  // vLLM's: prompt_token_ids and each choice's token_ids
  // Decoded with special tokens (the Mistral parser needs [TOOL_CALLS], [CALL_ID], [ARGS], as
  // vLLM's does): the end-of-sequence token's text is dropped from the output.
  bool drop_eos_text = false;
};

// Context of the conversion: the tokenizer (its BOS/EOS tokens for the template, and to tokenize
// chat prompts) and the chat template (null for completions-only use).
struct OpenAiContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  int32_t max_model_len = 0;  // chat default max_tokens: what is left of the context
  OpenAiLimits limits;
  // The family's parsers (--tool-call-parser, --reasoning-parser; resolved from the template).
  ToolCallParser tool_parser = ToolCallParser::kJson;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;
  // --structured-outputs-enable-in-reasoning: constraints cover the reasoning block too.
  bool constrain_reasoning = false;
  // --enable-auto-tool-choice: tool_choice "auto" (explicit or OpenAI's default with tools).
  bool auto_tool_choice = true;
};

// INVALID_ARGUMENT naming the parameter ("temperature: must be a number") for a body OpenAI's
// schema would refuse, and for parameters Tandem does not implement (echo, best_of > 1,
// suffix, functions). response_format, guided_* and tools/tool_choice become the request's
// OutputConstraint (openai_tools.h).
absl::StatusOr<OpenAiRequest> ConvertOpenAiRequest(OpenAiEndpoint endpoint,
                                                   const nlohmann::ordered_json& body,
                                                   const OpenAiContext& context);

// vLLM's POST /tokenize body: {"prompt", "add_special_tokens" (default true)}, or a chat
// {"messages", "tools", "chat_template_kwargs", "add_generation_prompt",
// "continue_final_message", "add_special_tokens" (default false: the template writes them)}
// rendered by the template; "return_token_strs" adds the tokens' strings.
struct TokenizeText {
  std::string model;
  std::string text;
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeText> TokenizeRequestText(const nlohmann::ordered_json& body,
                                                 const OpenAiContext& context);
// vLLM's POST /detokenize body: {"tokens": [ids]}.
absl::StatusOr<std::vector<int32_t>> DetokenizeRequestIds(const nlohmann::ordered_json& body,
                                                          const OpenAiContext& context);

}  // namespace tandem
