#pragma once

// One chat choice's output as OpenAI returns it: the reasoning (reasoning_content), the content
// and the tool calls, from the generated text. Streaming, each piece of text becomes deltas as
// soon as it is decided: reasoning and content as they arrive (a tag or call marker that may be
// forming is held back), a tool call's index, id and name once its name is complete, then its
// arguments as they are generated. Not streamed, the same parsers read the whole text, so both
// give the same message for a well-formed output. Not thread-safe; one per choice.

#include <optional>
#include <string>
#include <vector>

#include "router/http/reasoning_parser.h"
#include "router/http/tool_parsers.h"

namespace tandem {

struct ChatOutputOptions {
  ReasoningParser reasoning = ReasoningParser::kNone;
  ReasoningStart start = ReasoningStart::kAnswer;
  bool tools = false;  // tool calls are parsed (tool_choice auto / required / named)
  ToolCallParser parser = ToolCallParser::kJson;
  std::vector<std::string> tool_names;
  nlohmann::ordered_json tool_parameters;  // name -> parameters schema (types tagged formats)
  // tool_choice naming a function: the answer is that function's arguments object.
  std::string named;
  std::string id_base;     // call ids: "call_<id_base>_<i>"
  bool short_ids = false;  // 9 alphanumeric characters (Mistral's templates require them)
};

struct ToolCallDelta {
  int32_t index = 0;
  bool first = false;  // carries id, type and name
  std::string id;
  std::string name;
  std::string arguments;  // the next fragment
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::optional<std::string> reasoning;  // set when a reasoning parser is on
  std::optional<std::string> content;    // null when the answer is only tool calls
  std::vector<ChatToolCall> calls;
};

// The call id of call `i`: the model's own when it wrote one, else from `id_base`.
std::string ToolCallId(const ChatOutputOptions& options, size_t i, const std::string& model_id);

class ChatOutput {
 public:
  explicit ChatOutput(ChatOutputOptions options);

  // Streaming: the deltas `text` (the next decoded piece) makes.
  ChatDelta Feed(const std::string& text);
  // Streaming: the output ended; the deltas of what was held back.
  ChatDelta Finish();
  // Whether tool calls were streamed (finish_reason "tool_calls").
  bool streamed_calls() const { return !calls_.empty(); }

  // Not streamed: the whole message of a complete output.
  static ChatMessage Whole(const ChatOutputOptions& options, const std::string& text);

 private:
  struct CallState {
    bool first_sent = false;
    size_t args_sent = 0;
    bool args_done = false;
  };
  // Runs the tool-call parser over the answer so far and appends what changed.
  void DiffCalls(bool final, ChatDelta* out);

  ChatOutputOptions options_;
  ReasoningSplitter splitter_;
  std::string answer_;       // the answer text so far
  size_t content_sent_ = 0;  // bytes of the content (before the calls) sent
  std::vector<CallState> calls_;
};

}  // namespace tandem
