#pragma once

// A chat request's messages rendered by the model's chat template, as Hugging Face's
// apply_chat_template (and vLLM on top of it) renders them: the messages as the client sent
// them (key order kept; text parts joined; assistant tool-call arguments parsed into objects),
// `tools`, chat_template_kwargs, add_generation_prompt, and continue_final_message (the
// prompt cut after the final assistant message's text, so the model continues it).

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct OpenAiContext;

struct ChatRenderOptions {
  const nlohmann::ordered_json* tools = nullptr;            // the tools list, or null
  const nlohmann::ordered_json* template_kwargs = nullptr;  // chat_template_kwargs, or null
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

struct RenderedChat {
  std::string prompt;
  // continue_final_message: the final message's text (the output continues it); else empty.
  std::string continued;
};

// INVALID_ARGUMENT naming the field for malformed messages, chat_template_kwargs (a
// non-object, past the limits, or a key the request sets itself: messages, tools, bos_token,
// eos_token, add_generation_prompt), both add_generation_prompt and continue_final_message, a
// final message that is not the assistant's with continue_final_message, or a template error.
absl::StatusOr<RenderedChat> RenderChat(const nlohmann::ordered_json& messages,
                                        const OpenAiContext& context,
                                        const ChatRenderOptions& options);

// RenderChat with add_generation_prompt, returning the prompt.
absl::StatusOr<std::string> RenderChatPrompt(
    const nlohmann::ordered_json& messages, const OpenAiContext& context,
    const nlohmann::ordered_json* tools = nullptr,
    const nlohmann::ordered_json* template_kwargs = nullptr);

}  // namespace tandem
