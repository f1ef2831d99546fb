#pragma once

// OpenAI response bodies built from the Generation API's stream (GenerateResponse messages):
// whole completions, server-sent-event chunks, usage and error objects.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "router/http/openai_request.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

// {"error": {"message", "type", "param", "code"}} and the HTTP status for a status code.
struct OpenAiError {
  int http_status = 500;
  nlohmann::json body;
};
OpenAiError MakeOpenAiError(absl::StatusCode code, const std::string& message);

struct OpenAiResponderOptions {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  int32_t n = 1;
  bool logprobs = false;
  bool include_usage = false;
  const Tokenizer* tokenizer = nullptr;  // token strings of logprobs
  // Chat with tools: outputs that are tool calls become message.tool_calls (finish_reason
  // "tool_calls"); while streaming, such a choice's text is held back until its end.
  ToolCallOptions tools;
};

// Not thread-safe; one per request.
class OpenAiResponder {
 public:
  explicit OpenAiResponder(OpenAiResponderOptions options);

  // Streaming: the chunks (chat.completion.chunk / text_completion objects) `message` makes.
  std::vector<nlohmann::json> StreamChunks(const v1::GenerateResponse& message);
  // Streaming, after the last final with include_usage: the chunk with no choices and usage.
  nlohmann::json UsageChunk() const;

  // Non-streaming: collects `message`; Complete() is the whole response.
  void Accumulate(const v1::GenerateResponse& message);
  nlohmann::json Complete() const;

  nlohmann::json Usage() const;

 private:
  struct Choice {
    std::string text;
    nlohmann::json logprobs;  // endpoint's shape, filled as tokens arrive
    std::string finish_reason;
    int64_t text_offset = 0;
    bool started = false;  // chat stream: the role delta was sent
    int32_t last_id = -1;  // last token with logprobs
  };
  Choice& choice(int32_t index);
  nlohmann::json ChunkBase() const;
  // Logprobs of one chunk's tokens in the endpoint's shape, appended to `into` (a fresh object
  // when null).
  void AppendLogprobs(const v1::TokenChunk& chunk, nlohmann::json* into, Choice* ch);
  // The text `id` adds after `prev` (< 0: none).
  std::string TokenText(int32_t prev, int32_t id) const;
  void NotePrompt(const v1::GenerateResponse& message);
  void NoteFinal(const v1::GenerateFinal& final);
  // Chat with tools: the calls in a finished choice, if its text is a tool call.
  std::optional<std::vector<ParsedToolCall>> CallsOf(const Choice& ch, int32_t index) const;

  OpenAiResponderOptions options_;
  std::map<int32_t, Choice> choices_;
  int32_t prompt_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int32_t last_prompt_id_ = -1;  // from the echoed prompt ids (requested with logprobs)
};

}  // namespace tandem
