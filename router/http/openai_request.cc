#include "router/http/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// Depth of the deepest array/object, scanning bytes outside strings; stops past `limit`.
int32_t JsonDepth(std::string_view body, int32_t limit) {
  int32_t depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

// Optional number field: absent or null leaves `out` alone.
absl::Status GetNumber(const Json& body, const char* name, double lo, double hi,
                       std::optional<double>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Invalid(name, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Invalid(name, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status GetInt(const Json& body, const char* name, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    // Unsigned values above int64's range read as negative through get<int64_t>.
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    }
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) {
      return Invalid(name, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
    }
    *out = v;
    return absl::OkStatus();
  }
  return Invalid(name, "must be an integer");
}

absl::Status GetBool(const Json& body, const char* name, std::optional<bool>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Invalid(name, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const Json& body, const char* name, std::optional<std::string>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Invalid(name, "must be a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

#define RETURN_IF_ERROR(expr)                             \
  do {                                                    \
    if (absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)

// The sampling parameters both endpoints share.
absl::Status ConvertSampling(const Json& body, OpenAiEndpoint endpoint, OpenAiRequest* out) {
  v1::SamplingParams* s = out->generate.mutable_sampling();
  std::optional<double> d;
  RETURN_IF_ERROR(GetNumber(body, "temperature", 0, 2, &d));
  if (d) s->set_temperature(static_cast<float>(*d));
  d.reset();
  RETURN_IF_ERROR(GetNumber(body, "top_p", 0, 1, &d));
  if (d) {
    if (*d <= 0) return Invalid("top_p", "must be in (0, 1]");
    s->set_top_p(static_cast<float>(*d));
  }
  d.reset();
  RETURN_IF_ERROR(GetNumber(body, "presence_penalty", -2, 2, &d));
  if (d) s->set_presence_penalty(static_cast<float>(*d));
  d.reset();
  RETURN_IF_ERROR(GetNumber(body, "frequency_penalty", -2, 2, &d));
  if (d) s->set_frequency_penalty(static_cast<float>(*d));
  // vLLM's extensions, same meaning.
  d.reset();
  RETURN_IF_ERROR(GetNumber(body, "min_p", 0, 1, &d));
  if (d) s->set_min_p(static_cast<float>(*d));
  d.reset();
  RETURN_IF_ERROR(GetNumber(body, "repetition_penalty", 0, 1e6, &d));
  if (d) s->set_repetition_penalty(static_cast<float>(*d));
  std::optional<int64_t> i;
  RETURN_IF_ERROR(GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &i));
  if (i) s->set_top_k(*i < 0 ? 0 : static_cast<int32_t>(*i));
  i.reset();
  RETURN_IF_ERROR(GetInt(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &i));
  if (i) s->set_min_tokens(static_cast<int32_t>(*i));
  std::optional<bool> b;
  RETURN_IF_ERROR(GetBool(body, "ignore_eos", &b));
  if (b) s->set_ignore_eos(*b);
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "skip_special_tokens", &b));
  if (b) s->set_skip_special_tokens(*b);

  i.reset();
  RETURN_IF_ERROR(GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max(), &i));
  if (i) s->set_seed(static_cast<uint64_t>(*i));

  // max_completion_tokens (chat) supersedes the deprecated max_tokens.
  i.reset();
  std::optional<int64_t> max_completion;
  RETURN_IF_ERROR(GetInt(body, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &i));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    RETURN_IF_ERROR(GetInt(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(),
                           &max_completion));
  }
  if (max_completion) i = max_completion;
  if (i) s->set_max_tokens(static_cast<int32_t>(*i));

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      s->add_stop(it->get<std::string>());
    } else if (it->is_array()) {
      for (const Json& stop : *it) {
        if (!stop.is_string()) return Invalid("stop", "must be a string or a list of strings");
        s->add_stop(stop.get<std::string>());
      }
    } else {
      return Invalid("stop", "must be a string or a list of strings");
    }
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("logit_bias", "must map token ids to numbers");
    for (const auto& [key, value] : it->items()) {
      int64_t id = -1;
      if (key.empty() || key.size() > 10 ||
          key.find_first_not_of("0123456789") != std::string::npos) {
        return Invalid("logit_bias", absl::StrCat("'", key, "' is not a token id"));
      }
      id = std::stoll(key);
      if (!value.is_number() || !std::isfinite(value.get<double>())) {
        return Invalid("logit_bias", "values must be numbers");
      }
      if (id > std::numeric_limits<int32_t>::max()) {
        return Invalid("logit_bias", absl::StrCat("'", key, "' is not a token id"));
      }
      (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = value.get<float>();
    }
  }

  // Logprobs: completions take an integer (top alternatives), chat a boolean + top_logprobs.
  if (endpoint == OpenAiEndpoint::kCompletions) {
    i.reset();
    RETURN_IF_ERROR(GetInt(body, "logprobs", 0, 20, &i));
    if (i) {
      s->set_logprobs(static_cast<int32_t>(*i));
      out->logprobs = true;
    }
  } else {
    b.reset();
    RETURN_IF_ERROR(GetBool(body, "logprobs", &b));
    i.reset();
    RETURN_IF_ERROR(GetInt(body, "top_logprobs", 0, 20, &i));
    if (i && !b.value_or(false)) return Invalid("top_logprobs", "requires logprobs: true");
    if (b.value_or(false)) {
      s->set_logprobs(static_cast<int32_t>(i.value_or(0)));
      out->logprobs = true;
    }
  }
  return absl::OkStatus();
}

absl::Status RefuseUnsupported(const Json& body, OpenAiEndpoint endpoint) {
  if (auto it = body.find("echo"); it != body.end() && it->is_boolean() && it->get<bool>()) {
    return Invalid("echo", "not supported");
  }
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) {
      return Invalid("best_of", "only 1 is supported");
    }
  }
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    return Invalid("suffix", "not supported");
  }
  if (endpoint == OpenAiEndpoint::kCompletions) {
    for (const char* name : {"tools", "tool_choice", "functions"}) {
      if (auto it = body.find(name); it != body.end() && !it->is_null()) {
        return Invalid(name, "tool calling is a chat completions feature");
      }
    }
    if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
      return Invalid("chat_template_kwargs", "a chat completions feature");
    }
  }
  return absl::OkStatus();
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> MessageText(const Json& content, size_t index) {
  const std::string field = absl::StrCat("messages[", index, "].content");
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) return Invalid(field, "must be a string or a list of text parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", Json()) != Json("text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return Invalid(field, "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body, const OpenAiLimits& limits) {
  if (body.empty()) return absl::InvalidArgumentError("the request body is empty");
  if (JsonDepth(body, limits.max_json_depth) > limits.max_json_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("the JSON body nests deeper than ", limits.max_json_depth, " levels"));
  }
  Json parsed;
  try {
    parsed = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not valid JSON: ", e.what()));
  }
  if (!parsed.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  return parsed;
}

absl::StatusOr<std::string> RenderChatPrompt(const nlohmann::json& messages,
                                             const OpenAiContext& context,
                                             const nlohmann::json* tools,
                                             const nlohmann::json* template_kwargs) {
  if (template_kwargs != nullptr && !template_kwargs->is_null()) {
    const Json& kw = *template_kwargs;
    if (!kw.is_object()) {
      return Invalid("chat_template_kwargs", "must be an object (template variable -> value)");
    }
    if (static_cast<int64_t>(kw.size()) > context.limits.max_template_kwargs) {
      return Invalid("chat_template_kwargs",
                     absl::StrCat("at most ", context.limits.max_template_kwargs, " keys"));
    }
    if (static_cast<int64_t>(kw.dump().size()) > context.limits.max_template_kwargs_bytes) {
      return Invalid(
          "chat_template_kwargs",
          absl::StrCat("at most ", context.limits.max_template_kwargs_bytes, " bytes serialised"));
    }
    for (const char* reserved :
         {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"}) {
      if (kw.contains(reserved)) {
        return Invalid(absl::StrCat("chat_template_kwargs.", reserved),
                       "is set by the request itself");
      }
    }
  }
  if (!messages.is_array() || messages.empty()) {
    return Invalid("messages", "must be a non-empty list");
  }
  if (static_cast<int64_t>(messages.size()) > context.limits.max_messages) {
    return Invalid("messages", absl::StrCat("at most ", context.limits.max_messages));
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(field, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Invalid(field + ".role", "must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
      return Invalid(field + ".role", absl::StrCat("unknown role '", r, "'"));
    }
    auto content = m.find("content");
    auto calls = m.find("tool_calls");
    const bool has_calls = r == "assistant" && calls != m.end() && !calls->is_null();
    if (content == m.end() && !has_calls) return Invalid(field + ".content", "is required");
    auto text =
        content == m.end() ? absl::StatusOr<std::string>(std::string()) : MessageText(*content, i);
    if (!text.ok()) return text.status();
    nlohmann::ordered_json entry;
    entry["role"] = r == "developer" ? "system" : r;
    entry["content"] = *text;
    if (has_calls) {
      // Templates (Llama 3.1, Qwen2.5, Mistral) read function.name and function.arguments as an
      // object, as Hugging Face's apply_chat_template expects.
      if (!calls->is_array()) return Invalid(field + ".tool_calls", "must be a list");
      nlohmann::ordered_json out_calls = nlohmann::ordered_json::array();
      for (size_t k = 0; k < calls->size(); ++k) {
        const Json& call = (*calls)[k];
        const std::string cf = absl::StrCat(field, ".tool_calls[", k, "]");
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].value("name", Json()).is_string()) {
          return Invalid(cf,
                         "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                         "\"arguments\"}}");
        }
        nlohmann::ordered_json fn;
        fn["name"] = call["function"]["name"];
        Json args = call["function"].value("arguments", Json::object());
        if (args.is_string()) {
          Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
          if (parsed.is_discarded()) return Invalid(cf + ".function.arguments", "is not JSON");
          args = parsed;
        }
        fn["arguments"] = nlohmann::ordered_json::parse(args.dump());
        nlohmann::ordered_json oc;
        oc["id"] = call.value("id", std::string());
        oc["type"] = "function";
        oc["function"] = std::move(fn);
        out_calls.push_back(std::move(oc));
      }
      entry["tool_calls"] = std::move(out_calls);
    }
    if (r == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) {
        entry["tool_call_id"] = *id;
      }
      if (auto name = m.find("name"); name != m.end() && name->is_string()) entry["name"] = *name;
    }
    list.push_back(std::move(entry));
  }
  nlohmann::ordered_json variables;
  if (template_kwargs != nullptr && template_kwargs->is_object()) {
    // Set first: the request's own variables below take precedence (checked above).
    for (const auto& [key, value] : template_kwargs->items()) {
      variables[key] = nlohmann::ordered_json::parse(value.dump());
    }
  }
  variables["messages"] = std::move(list);
  variables["add_generation_prompt"] = true;
  if (tools != nullptr && tools->is_array() && !tools->empty()) {
    variables["tools"] = nlohmann::ordered_json::parse(tools->dump());
  }
  const Tokenizer& tok = *context.tokenizer;
  variables["bos_token"] = tok.bos_id() ? std::string(tok.IdToToken(*tok.bos_id())) : "";
  variables["eos_token"] = tok.eos_id() ? std::string(tok.IdToToken(*tok.eos_id())) : "";
  auto rendered = context.chat_template->Render(variables);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the chat template failed: ", rendered.status().message()));
  }
  return rendered;
}

absl::StatusOr<OpenAiRequest> ConvertOpenAiRequest(OpenAiEndpoint endpoint,
                                                   const nlohmann::json& body,
                                                   const OpenAiContext& context) {
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  OpenAiRequest out;
  RETURN_IF_ERROR(RefuseUnsupported(body, endpoint));
  std::optional<std::string> str;
  RETURN_IF_ERROR(GetString(body, "model", &str));
  if (str) out.generate.set_model(*str);
  str.reset();
  RETURN_IF_ERROR(GetString(body, "user", &str));
  if (str) out.user = *str;
  // vLLM's cache_salt: the Generation service puts the caller's tenant in front of it, so a
  // client separates its own prefixes but never reaches another tenant's.
  str.reset();
  RETURN_IF_ERROR(GetString(body, "cache_salt", &str));
  if (str) out.generate.set_cache_salt(*str);
  std::optional<bool> b;
  RETURN_IF_ERROR(GetBool(body, "stream", &b));
  out.stream = b.value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("stream_options", "must be an object");
    if (!out.stream) return Invalid("stream_options", "only allowed with stream: true");
    b.reset();
    RETURN_IF_ERROR(GetBool(*it, "include_usage", &b));
    out.include_usage = b.value_or(false);
  }
  std::optional<int64_t> n;
  RETURN_IF_ERROR(GetInt(body, "n", 1, 128, &n));
  if (n) out.generate.set_n(static_cast<int32_t>(*n));
  RETURN_IF_ERROR(ConvertSampling(body, endpoint, &out));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    auto tools = ParseToolOptions(body);
    if (!tools.ok()) return tools.status();
    out.tools = std::move(*tools);
    if (context.chat_template != nullptr) {
      // Constrained calls and call ids follow the model family's template.
      out.tools.format = ToolCallFormatOfTemplate(context.chat_template->source());
      out.tools.short_ids = MistralCallIds(context.chat_template->source());
    }
  }
  RETURN_IF_ERROR(ConvertOutputConstraint(body, out.tools,
                                          out.generate.mutable_sampling()->mutable_constraint()));

  if (endpoint == OpenAiEndpoint::kCompletions) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return Invalid("prompt", "is required");
    const Json* prompt = &*it;
    // A list holding one prompt (a string or token ids) is that prompt.
    if (prompt->is_array() && prompt->size() == 1 &&
        ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
      prompt = &(*prompt)[0];
    }
    if (prompt->is_string()) {
      out.generate.set_text(prompt->get<std::string>());
    } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
      for (const Json& id : *prompt) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
          return Invalid("prompt", "token ids must be non-negative integers");
        }
        out.generate.mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else if (prompt->is_array() && prompt->size() > 1) {
      return Invalid("prompt", "one prompt per request (batched prompts are not supported)");
    } else {
      return Invalid("prompt", "must be a string or a list of token ids");
    }
    return out;
  }

  auto messages = body.find("messages");
  if (messages == body.end()) return Invalid("messages", "is required");
  auto tools_it = body.find("tools");
  auto kwargs_it = body.find("chat_template_kwargs");
  auto text = RenderChatPrompt(
      *messages, context,
      tools_it != body.end() && out.tools.choice != ToolCallOptions::Choice::kNone ? &*tools_it
                                                                                   : nullptr,
      kwargs_it != body.end() ? &*kwargs_it : nullptr);
  if (!text.ok()) return text.status();
  // The template writes the special tokens (BOS) itself, as Hugging Face's apply_chat_template.
  auto ids = context.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  if (!ids.ok()) return Invalid("messages", std::string(ids.status().message()));
  if (ids->empty()) return Invalid("messages", "the rendered prompt has no tokens");
  out.generate.mutable_token_ids()->mutable_ids()->Assign(ids->begin(), ids->end());
  v1::SamplingParams* s = out.generate.mutable_sampling();
  if (!s->has_max_tokens() && context.max_model_len > 0) {
    // OpenAI's chat default: as many tokens as the context leaves.
    const int64_t left = static_cast<int64_t>(context.max_model_len) - ids->size();
    if (left < 1) {
      return Invalid("messages",
                     absl::StrCat("the prompt's ", ids->size(),
                                  " tokens fill the model's context of ", context.max_model_len));
    }
    s->set_max_tokens(static_cast<int32_t>(left));
  }
  return out;
}

}  // namespace tandem
