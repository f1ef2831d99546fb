#include "common/tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_eval.h"
#include "common/tokenizer/chat_template_parser.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {
namespace {

// meta-llama/Llama-2-7b-chat-hf's template.
constexpr std::string_view kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

// meta-llama/Meta-Llama-3-8B-Instruct's template.
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";

constexpr std::string_view kChatml =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

}  // namespace

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source) {
  auto body = chat_template::ParseTemplate(absl::string_view(source.data(), source.size()));
  if (!body.ok()) return body.status();
  std::unique_ptr<ChatTemplate> t(new ChatTemplate);
  t->source_ = std::string(source);
  t->body_ = std::move(body).value();
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& variables,
                                                 const ChatTemplateLimits& limits) const {
  chat_template::RenderLimits r;
  r.budget.steps = limits.max_steps;
  r.budget.bytes = limits.max_work_bytes;
  r.budget.max_string = limits.max_output_bytes;
  r.max_output_bytes = limits.max_output_bytes;
  return chat_template::Render(body_, variables, r);
}

std::string_view BuiltinChatTemplateSource(BuiltinChatTemplate which) {
  switch (which) {
    case BuiltinChatTemplate::kLlama2:
      return kLlama2;
    case BuiltinChatTemplate::kLlama3:
      return kLlama3;
    case BuiltinChatTemplate::kChatml:
      return kChatml;
  }
  return kChatml;
}

std::optional<BuiltinChatTemplate> BuiltinChatTemplateByName(std::string_view name) {
  if (name == "llama-2" || name == "llama2") return BuiltinChatTemplate::kLlama2;
  if (name == "llama-3" || name == "llama3") return BuiltinChatTemplate::kLlama3;
  if (name == "chatml") return BuiltinChatTemplate::kChatml;
  return std::nullopt;
}

absl::StatusOr<ChatTemplateChoice> ChooseChatTemplate(const Tokenizer& tokenizer,
                                                      const std::string& override_spec) {
  if (!override_spec.empty()) {
    if (auto builtin = BuiltinChatTemplateByName(override_spec)) {
      return ChatTemplateChoice{std::string(BuiltinChatTemplateSource(*builtin)),
                                "built-in " + override_spec};
    }
    std::ifstream in(override_spec, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("chat template '", override_spec,
                                              "': neither llama-2, llama-3, chatml nor a file"));
    }
    std::stringstream text;
    text << in.rdbuf();
    return ChatTemplateChoice{text.str(), override_spec};
  }
  if (!tokenizer.chat_template().empty()) {
    return ChatTemplateChoice{tokenizer.chat_template(), "tokenizer_config.json"};
  }
  BuiltinChatTemplate which = BuiltinChatTemplate::kLlama2;
  std::string name = "llama-2";
  if (tokenizer.TokenToId("<|start_header_id|>").has_value()) {
    which = BuiltinChatTemplate::kLlama3;
    name = "llama-3";
  } else if (tokenizer.TokenToId("<|im_start|>").has_value()) {
    which = BuiltinChatTemplate::kChatml;
    name = "chatml";
  }
  return ChatTemplateChoice{std::string(BuiltinChatTemplateSource(which)), "built-in " + name};
}

}  // namespace tandem
