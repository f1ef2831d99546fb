#pragma once

// OpenAI response bodies built from the Generation API's stream (GenerateResponse messages):
// whole completions, server-sent-event chunks, usage and error objects.

#include <cstdint>
#include <map>
#include <memory>
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
  nlohmann::ordered_json body;
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
  // Chat: how each choice's text becomes reasoning_content, content and tool_calls
  // (chat_output.h; id_base is set per choice here).
  ChatOutputOptions chat;
  bool return_token_ids = false;  // prompt_token_ids and each choice's token_ids (vLLM)
  // Text decoded with special tokens: the end-of-sequence token's text is dropped.
  bool drop_eos_text = false;
};

// Not thread-safe; one per request.
class OpenAiResponder {
 public:
  explicit OpenAiResponder(OpenAiResponderOptions options);

  // Streaming: the chunks (chat.completion.chunk / text_completion objects) `message` makes.
  std::vector<nlohmann::ordered_json> StreamChunks(const v1::GenerateResponse& message);
  // Streaming, after the last final with include_usage: the chunk with no choices and usage.
  nlohmann::ordered_json UsageChunk() const;

  // Non-streaming: collects `message`; Complete() is the whole response.
  void Accumulate(const v1::GenerateResponse& message);
  nlohmann::ordered_json Complete() const;

  nlohmann::ordered_json Usage() const;

 private:
  struct Choice {
    std::string text;
    nlohmann::ordered_json logprobs;  // endpoint's shape, filled as tokens arrive
    std::string finish_reason;
    int64_t text_offset = 0;
    bool started = false;                // chat stream: the role delta was sent
    int32_t last_id = -1;                // last token with logprobs
    std::vector<int32_t> token_ids;      // with return_token_ids
    std::unique_ptr<ChatOutput> output;  // chat stream: the reasoning / content / calls split
  };
  Choice& choice(int32_t index);
  ChatOutputOptions ChatOptions(int32_t index) const;
  nlohmann::ordered_json ChunkBase() const;
  // A chat.completion.chunk of one choice with `delta` (and logprobs / token ids when given).
  nlohmann::ordered_json ChatChunk(int32_t index, Choice& ch, const ChatDelta& delta,
                                   nlohmann::ordered_json logprobs,
                                   const std::vector<int32_t>* token_ids);
  // Logprobs of one chunk's tokens in the endpoint's shape, appended to `into` (a fresh object
  // when null).
  void AppendLogprobs(const v1::TokenChunk& chunk, nlohmann::ordered_json* into, Choice* ch);
  // The text `id` adds after `prev` (< 0: none).
  std::string TokenText(int32_t prev, int32_t id) const;
  void NotePrompt(const v1::GenerateResponse& message);
  // A chunk's text, without the end-of-sequence token's text when drop_eos_text.
  std::string ChunkText(const v1::TokenChunk& chunk) const;
  void NoteFinal(const v1::GenerateFinal& final);

  OpenAiResponderOptions options_;
  std::map<int32_t, Choice> choices_;
  int32_t prompt_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int32_t last_prompt_id_ = -1;      // from the echoed prompt ids (requested with logprobs)
  std::vector<int32_t> prompt_ids_;  // with return_token_ids
  bool prompt_ids_sent_ = false;     // streaming: in the first chunk
};

}  // namespace tandem
