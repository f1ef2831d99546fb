#include "router/http/chat_prompt.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/http/openai_request.h"
#include "router/http/request_error.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> MessageText(const Json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return InvalidField(field, "must be a string or a list of text parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", Json()) != Json("text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidField(field,
                          "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::Status CheckTemplateKwargs(const Json& kw, const OpenAiContext& context) {
  if (!kw.is_object()) {
    return InvalidField("chat_template_kwargs", "must be an object (template variable -> value)");
  }
  if (static_cast<int64_t>(kw.size()) > context.limits.max_template_kwargs) {
    return InvalidField("chat_template_kwargs",
                        absl::StrCat("at most ", context.limits.max_template_kwargs, " keys"));
  }
  if (static_cast<int64_t>(kw.dump().size()) > context.limits.max_template_kwargs_bytes) {
    return InvalidField(
        "chat_template_kwargs",
        absl::StrCat("at most ", context.limits.max_template_kwargs_bytes, " bytes serialised"));
  }
  for (const char* reserved :
       {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"}) {
    if (kw.contains(reserved)) {
      return InvalidField(absl::StrCat("chat_template_kwargs.", reserved),
                          "is set by the request itself");
    }
  }
  return absl::OkStatus();
}

// One message as the template sees it: the client's object (its keys in its order), with
// "developer" as "system", text parts joined, a null or absent content as "" (as vLLM hands
// templates a message) and tool-call arguments parsed into objects.
absl::StatusOr<Json> TemplateMessage(const Json& m, size_t i) {
  const std::string field = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return InvalidField(field, "must be an object");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string())
    return InvalidField(field + ".role", "must be a string");
  const std::string r = role->get<std::string>();
  if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
    return InvalidField(field + ".role", absl::StrCat("unknown role '", r, "'"));
  }
  auto content = m.find("content");
  auto calls = m.find("tool_calls");
  const bool has_calls = r == "assistant" && calls != m.end() && !calls->is_null();
  if (content == m.end() && !has_calls) return InvalidField(field + ".content", "is required");
  Json out = m;
  if (r == "developer") out["role"] = "system";
  if (content == m.end() || content->is_null()) {
    out["content"] = "";
  } else {
    auto text = MessageText(*content, field + ".content");
    if (!text.ok()) return text.status();
    out["content"] = *text;
  }
  if (has_calls) {
    // Templates (Llama 3.1, Qwen2.5, Mistral) read function.arguments as an object, as Hugging
    // Face's apply_chat_template expects.
    if (!calls->is_array()) return InvalidField(field + ".tool_calls", "must be a list");
    Json& out_calls = out["tool_calls"];
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json& call = (*calls)[k];
      const std::string cf = absl::StrCat(field, ".tool_calls[", k, "]");
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
          !call["function"].value("name", Json()).is_string()) {
        return InvalidField(cf,
                            "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                            "\"arguments\"}}");
      }
      Json& fn = out_calls[k]["function"];
      if (auto args = fn.find("arguments"); args != fn.end() && args->is_string()) {
        Json parsed = Json::parse(args->get<std::string>(), nullptr, false);
        if (parsed.is_discarded()) return InvalidField(cf + ".function.arguments", "is not JSON");
        *args = std::move(parsed);
      } else if (args == fn.end()) {
        fn["arguments"] = Json::object();
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<RenderedChat> RenderChat(const Json& messages, const OpenAiContext& context,
                                        const ChatRenderOptions& options) {
  if (options.template_kwargs != nullptr && !options.template_kwargs->is_null()) {
    if (absl::Status st = CheckTemplateKwargs(*options.template_kwargs, context); !st.ok()) {
      return st;
    }
  }
  if (options.add_generation_prompt && options.continue_final_message) {
    return InvalidField("continue_final_message",
                        "cannot be true together with add_generation_prompt (set it to false)");
  }
  if (!messages.is_array() || messages.empty()) {
    return InvalidField("messages", "must be a non-empty list");
  }
  if (static_cast<int64_t>(messages.size()) > context.limits.max_messages) {
    return InvalidField("messages", absl::StrCat("at most ", context.limits.max_messages));
  }
  Json list = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    auto m = TemplateMessage(messages[i], i);
    if (!m.ok()) return m.status();
    list.push_back(std::move(*m));
  }
  RenderedChat out;
  if (options.continue_final_message) {
    const Json& last = list.back();
    if (last.value("role", std::string()) != "assistant" || !last.contains("content") ||
        !last["content"].is_string()) {
      return InvalidField("continue_final_message",
                          "the final message must be the assistant's, with text content");
    }
    out.continued = last["content"].get<std::string>();
  }
  Json variables = Json::object();
  if (options.template_kwargs != nullptr && options.template_kwargs->is_object()) {
    // Set first: the request's own variables below take precedence (checked above).
    for (const auto& [key, value] : options.template_kwargs->items()) variables[key] = value;
  }
  variables["messages"] = std::move(list);
  variables["add_generation_prompt"] = options.add_generation_prompt;
  if (options.tools != nullptr && options.tools->is_array() && !options.tools->empty()) {
    variables["tools"] = *options.tools;
  }
  const Tokenizer& tok = *context.tokenizer;
  variables["bos_token"] = tok.bos_id() ? std::string(tok.IdToToken(*tok.bos_id())) : "";
  variables["eos_token"] = tok.eos_id() ? std::string(tok.IdToToken(*tok.eos_id())) : "";
  auto rendered = context.chat_template->Render(variables);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the chat template failed: ", rendered.status().message()));
  }
  out.prompt = std::move(rendered).value();
  if (options.continue_final_message) {
    // As transformers' apply_chat_template: cut the prompt after the final message's text (the
    // template's end-of-turn goes), keeping its leading spaces only where the template did.
    const std::string& final_text = out.continued;
    static constexpr char kSpace[] = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
    const size_t b = final_text.find_first_not_of(kSpace);
    const size_t e = final_text.find_last_not_of(kSpace);
    const std::string stripped = b == std::string::npos ? "" : final_text.substr(b, e - b + 1);
    const std::string lstripped = b == std::string::npos ? "" : final_text.substr(b);
    const size_t at = out.prompt.rfind(stripped);
    if (at == std::string::npos) {
      return InvalidField("continue_final_message",
                          "the final message does not appear in the rendered chat");
    }
    if (out.prompt.compare(at, lstripped.size(), final_text) == 0) {
      out.prompt.resize(at + lstripped.size());
    } else {
      out.prompt.resize(at + stripped.size());
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderChatPrompt(const Json& messages, const OpenAiContext& context,
                                             const Json* tools, const Json* template_kwargs) {
  ChatRenderOptions o;
  o.tools = tools;
  o.template_kwargs = template_kwargs;
  auto r = RenderChat(messages, context, o);
  if (!r.ok()) return r.status();
  return std::move(r->prompt);
}

}  // namespace tandem
