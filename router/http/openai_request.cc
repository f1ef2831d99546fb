#include "router/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/http/answer_constraint.h"
#include "router/http/request_error.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// What a body's shape costs before it is parsed: the deepest nesting, and the keys of its
// objects (counting a key at each ':' outside strings). Stops at the first bound crossed.
struct JsonShape {
  int32_t depth = 0;
  int32_t most_keys = 0;
  int64_t key_pairs = 0;  // sum over objects of 1 + 2 + ... + keys: ordered insertion's cost
};
JsonShape ScanJsonShape(std::string_view body, const OpenAiLimits& limits) {
  JsonShape shape;
  std::vector<int32_t> keys;  // per open container: its keys (-1 for an array)
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
      keys.push_back(c == '{' ? 0 : -1);
      shape.depth = std::max(shape.depth, static_cast<int32_t>(keys.size()));
      if (shape.depth > limits.max_json_depth) return shape;
    } else if (c == ']' || c == '}') {
      if (!keys.empty()) keys.pop_back();
    } else if (c == ':' && !keys.empty() && keys.back() >= 0) {
      const int32_t k = ++keys.back();
      shape.most_keys = std::max(shape.most_keys, k);
      shape.key_pairs += k;
      if (k > limits.max_object_keys || shape.key_pairs > limits.max_key_pairs) return shape;
    }
  }
  return shape;
}

// Optional number field: absent or null leaves `out` alone.
absl::Status GetNumber(const Json& body, const char* name, double lo, double hi,
                       std::optional<double>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return InvalidField(name, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return InvalidField(name, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
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
      return InvalidField(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    }
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) {
      return InvalidField(name, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
    }
    *out = v;
    return absl::OkStatus();
  }
  return InvalidField(name, "must be an integer");
}

absl::Status GetBool(const Json& body, const char* name, std::optional<bool>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return InvalidField(name, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const Json& body, const char* name, std::optional<std::string>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return InvalidField(name, "must be a string");
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
    if (*d <= 0) return InvalidField("top_p", "must be in (0, 1]");
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
        if (!stop.is_string()) return InvalidField("stop", "must be a string or a list of strings");
        s->add_stop(stop.get<std::string>());
      }
    } else {
      return InvalidField("stop", "must be a string or a list of strings");
    }
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidField("logit_bias", "must map token ids to numbers");
    for (const auto& [key, value] : it->items()) {
      int64_t id = -1;
      if (key.empty() || key.size() > 10 ||
          key.find_first_not_of("0123456789") != std::string::npos) {
        return InvalidField("logit_bias", absl::StrCat("'", key, "' is not a token id"));
      }
      id = std::stoll(key);
      if (!value.is_number() || !std::isfinite(value.get<double>())) {
        return InvalidField("logit_bias", "values must be numbers");
      }
      if (id > std::numeric_limits<int32_t>::max()) {
        return InvalidField("logit_bias", absl::StrCat("'", key, "' is not a token id"));
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
    if (i && !b.value_or(false)) return InvalidField("top_logprobs", "requires logprobs: true");
    if (b.value_or(false)) {
      s->set_logprobs(static_cast<int32_t>(i.value_or(0)));
      out->logprobs = true;
    }
  }
  return absl::OkStatus();
}

absl::Status RefuseUnsupported(const Json& body, OpenAiEndpoint endpoint) {
  if (auto it = body.find("echo"); it != body.end() && it->is_boolean() && it->get<bool>()) {
    return InvalidField("echo", "not supported");
  }
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) {
      return InvalidField("best_of", "only 1 is supported");
    }
  }
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    return InvalidField("suffix", "not supported");
  }
  if (endpoint == OpenAiEndpoint::kCompletions) {
    for (const char* name : {"tools", "tool_choice", "functions"}) {
      if (auto it = body.find(name); it != body.end() && !it->is_null()) {
        return InvalidField(name, "tool calling is a chat completions feature");
      }
    }
    if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
      return InvalidField("chat_template_kwargs", "a chat completions feature");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> ParseJsonBody(std::string_view body, const OpenAiLimits& limits) {
  if (body.empty()) return absl::InvalidArgumentError("the request body is empty");
  const JsonShape shape = ScanJsonShape(body, limits);
  if (shape.depth > limits.max_json_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("the JSON body nests deeper than ", limits.max_json_depth, " levels"));
  }
  if (shape.most_keys > limits.max_object_keys) {
    return absl::InvalidArgumentError(
        absl::StrCat("a JSON object in the body has more than ", limits.max_object_keys, " keys"));
  }
  if (shape.key_pairs > limits.max_key_pairs) {
    return absl::InvalidArgumentError("the JSON body's objects have too many keys in all");
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

absl::StatusOr<OpenAiRequest> ConvertOpenAiRequest(OpenAiEndpoint endpoint, const Json& body,
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
    if (!it->is_object()) return InvalidField("stream_options", "must be an object");
    if (!out.stream) return InvalidField("stream_options", "only allowed with stream: true");
    b.reset();
    RETURN_IF_ERROR(GetBool(*it, "include_usage", &b));
    out.include_usage = b.value_or(false);
  }
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "return_token_ids", &b));
  out.return_token_ids = b.value_or(false);
  std::optional<int64_t> n;
  RETURN_IF_ERROR(GetInt(body, "n", 1, 128, &n));
  if (n) out.generate.set_n(static_cast<int32_t>(*n));
  RETURN_IF_ERROR(ConvertSampling(body, endpoint, &out));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    auto tools = ParseToolOptions(body);
    if (!tools.ok()) return tools.status();
    out.tools = std::move(*tools);
    if (out.tools.choice == ToolCallOptions::Choice::kAuto && !context.auto_tool_choice) {
      return InvalidField("tool_choice",
                          "\"auto\" tool choice requires --enable-auto-tool-choice on the server");
    }
    // Constrained calls follow the family's format; call ids the shape its template checks.
    out.tools.format = ToolCallFormatOf(context.tool_parser);
    if (context.chat_template != nullptr) {
      out.tools.short_ids = MistralCallIds(context.chat_template->source());
    }
  }
  RETURN_IF_ERROR(ConvertOutputConstraint(body, out.tools,
                                          out.generate.mutable_sampling()->mutable_constraint()));

  if (endpoint == OpenAiEndpoint::kCompletions) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return InvalidField("prompt", "is required");
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
          return InvalidField("prompt", "token ids must be non-negative integers");
        }
        out.generate.mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else if (prompt->is_array() && prompt->size() > 1) {
      return InvalidField("prompt", "one prompt per request (batched prompts are not supported)");
    } else {
      return InvalidField("prompt", "must be a string or a list of token ids");
    }
    return out;
  }

  auto messages = body.find("messages");
  if (messages == body.end()) return InvalidField("messages", "is required");
  ChatRenderOptions render;
  auto tools_it = body.find("tools");
  if (tools_it != body.end() && out.tools.choice != ToolCallOptions::Choice::kNone) {
    render.tools = &*tools_it;
  }
  auto kwargs_it = body.find("chat_template_kwargs");
  if (kwargs_it != body.end()) render.template_kwargs = &*kwargs_it;
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "continue_final_message", &b));
  render.continue_final_message = b.value_or(false);
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "add_generation_prompt", &b));
  render.add_generation_prompt = b.value_or(!render.continue_final_message);
  auto rendered = RenderChat(*messages, context, render);
  if (!rendered.ok()) return rendered.status();
  const std::string* text = &rendered->prompt;

  // The output: reasoning (where the prompt leaves it), then the answer, where tool calls are
  // parsed and any constraint applies.
  ChatOutputOptions& chat = out.chat;
  chat.reasoning = context.reasoning_parser;
  chat.start = ReasoningStartOf(context.reasoning_parser, rendered->prompt, rendered->continued);
  chat.tools = out.tools.returns_calls();
  chat.parser = out.tools.choice == ToolCallOptions::Choice::kRequired
                    ? RequiredOutputParser(out.tools.format, context.tool_parser)
                    : context.tool_parser;
  for (const auto& t : out.tools.tools) {
    chat.tool_names.push_back(t.name);
    chat.tool_parameters[t.name] = t.parameters;
  }
  if (out.tools.choice == ToolCallOptions::Choice::kNamed) chat.named = out.tools.named;
  chat.short_ids = out.tools.short_ids;
  v1::SamplingParams* sampling = out.generate.mutable_sampling();
  if (chat.tools && chat.parser == ToolCallParser::kMistral &&
      !sampling->has_skip_special_tokens()) {
    // Mistral's call markers are special tokens: keep them in the text, as vLLM does.
    sampling->set_skip_special_tokens(false);
    out.drop_eos_text = true;
  }
  if (!context.constrain_reasoning) {
    RETURN_IF_ERROR(ConstrainAnswerOnly(chat.reasoning, chat.start,
                                        out.generate.mutable_sampling()->mutable_constraint()));
  }
  // The template writes the special tokens (BOS) itself, as Hugging Face's apply_chat_template.
  auto ids = context.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  if (!ids.ok()) return InvalidField("messages", std::string(ids.status().message()));
  if (ids->empty()) return InvalidField("messages", "the rendered prompt has no tokens");
  out.generate.mutable_token_ids()->mutable_ids()->Assign(ids->begin(), ids->end());
  v1::SamplingParams* s = out.generate.mutable_sampling();
  if (!s->has_max_tokens() && context.max_model_len > 0) {
    // OpenAI's chat default: as many tokens as the context leaves.
    const int64_t left = static_cast<int64_t>(context.max_model_len) - ids->size();
    if (left < 1) {
      return InvalidField(
          "messages", absl::StrCat("the prompt's ", ids->size(),
                                   " tokens fill the model's context of ", context.max_model_len));
    }
    s->set_max_tokens(static_cast<int32_t>(left));
  }
  return out;
}

absl::StatusOr<TokenizeText> TokenizeRequestText(const Json& body, const OpenAiContext& context) {
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  TokenizeText out;
  std::optional<std::string> str;
  RETURN_IF_ERROR(GetString(body, "model", &str));
  if (str) out.model = *str;
  std::optional<bool> b;
  RETURN_IF_ERROR(GetBool(body, "return_token_strs", &b));
  out.return_token_strs = b.value_or(false);
  auto messages = body.find("messages");
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "add_special_tokens", &b));
  out.add_special_tokens = b.value_or(messages == body.end());
  if (messages == body.end()) {
    str.reset();
    RETURN_IF_ERROR(GetString(body, "prompt", &str));
    if (!str) return InvalidField("prompt", "is required (or messages)");
    out.text = std::move(*str);
    return out;
  }
  if (context.chat_template == nullptr) return InvalidField("messages", "no chat template");
  ChatRenderOptions render;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) render.tools = &*t;
  if (auto k = body.find("chat_template_kwargs"); k != body.end()) render.template_kwargs = &*k;
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "continue_final_message", &b));
  render.continue_final_message = b.value_or(false);
  b.reset();
  RETURN_IF_ERROR(GetBool(body, "add_generation_prompt", &b));
  render.add_generation_prompt = b.value_or(!render.continue_final_message);
  auto rendered = RenderChat(*messages, context, render);
  if (!rendered.ok()) return rendered.status();
  out.text = std::move(rendered->prompt);
  return out;
}

absl::StatusOr<std::vector<int32_t>> DetokenizeRequestIds(const Json& body,
                                                          const OpenAiContext& context) {
  auto it = body.is_object() ? body.find("tokens") : body.end();
  if (!body.is_object() || it == body.end() || !it->is_array()) {
    return InvalidField("tokens", "must be a list of token ids");
  }
  std::vector<int32_t> ids;
  const int32_t vocab = context.tokenizer->vocab_size();
  for (const Json& id : *it) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
      return InvalidField("tokens", absl::StrCat("token ids must be in [0, ", vocab, ")"));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

}  // namespace tandem
