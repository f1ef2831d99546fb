#pragma once

// Chat templates: the Jinja templates of tokenizer_config.json ("chat_template") that turn a
// list of messages into a prompt, rendered the way Hugging Face's apply_chat_template does
// (trim_blocks, lstrip_blocks, its tojson and raise_exception). The interpreter implements the
// subset chat templates use; see chat_template_parser.h. Built-in templates cover models
// whose tokenizer has none.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

class Tokenizer;

namespace chat_template {
struct Node;
}  // namespace chat_template

struct ChatTemplateLimits {
  int64_t max_steps = 1'000'000;       // expression evaluations and executed nodes
  size_t max_output_bytes = 16 << 20;  // the rendered prompt
  int64_t max_work_bytes = 256 << 20;  // bytes of all strings built while rendering
};

// Immutable after Parse; Render may run concurrently from any number of threads.
class ChatTemplate {
 public:
  // INVALID_ARGUMENT (with the line) for syntax the interpreter does not accept.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  ~ChatTemplate();

  // `variables`: a JSON object, e.g. {"messages": [...], "add_generation_prompt": true,
  // "bos_token": "<s>", "eos_token": "</s>"}. INVALID_ARGUMENT when the template fails
  // (raise_exception, a type error), RESOURCE_EXHAUSTED past the limits.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                                     const ChatTemplateLimits& limits = {}) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  std::string source_;
  std::vector<std::unique_ptr<chat_template::Node>> body_;
};

// Templates for tokenizers without one: Meta's Llama 2 chat format ("[INST] ... [/INST]"),
// Llama 3's header format, and ChatML ("<|im_start|>role\n...<|im_end|>").
enum class BuiltinChatTemplate { kLlama2, kLlama3, kChatml };
std::string_view BuiltinChatTemplateSource(BuiltinChatTemplate which);
// "llama-2", "llama-3" or "chatml".
std::optional<BuiltinChatTemplate> BuiltinChatTemplateByName(std::string_view name);

// Which template serves `tokenizer`: `override_spec` when set (a built-in name, or the path of
// a file holding a template), else the tokenizer's chat_template, else the built-in that
// matches its special tokens (<|start_header_id|>: llama-3, <|im_start|>: chatml, otherwise
// llama-2). `origin` says which, for logs.
struct ChatTemplateChoice {
  std::string source;
  std::string origin;
};
absl::StatusOr<ChatTemplateChoice> ChooseChatTemplate(const Tokenizer& tokenizer,
                                                      const std::string& override_spec);

}  // namespace tandem
