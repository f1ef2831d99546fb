#include "router/http/openai_response.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "common/tokenizer/tokenizer.h"
#include "router/finish_reason.h"

namespace tandem {

using Json = nlohmann::json;

namespace {

std::vector<int> Bytes(const std::string& s) {
  std::vector<int> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

}  // namespace

OpenAiError MakeOpenAiError(absl::StatusCode code, const std::string& message) {
  OpenAiError e;
  std::string type = "server_error";
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnimplemented:
      e.http_status = 501;
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      break;
    default:
      e.http_status = 500;
  }
  e.body = {{"error",
             {{"message", message},
              {"type", type},
              {"param", nullptr},
              {"code", absl::StatusCodeToString(code)}}}};
  return e;
}

OpenAiResponder::OpenAiResponder(OpenAiResponderOptions options) : options_(std::move(options)) {}

OpenAiResponder::Choice& OpenAiResponder::choice(int32_t index) { return choices_[index]; }

std::string OpenAiResponder::TokenText(int32_t prev, int32_t id) const {
  // Decoded after the token before it: decoders drop a leading space at the start of a text.
  if (prev >= 0) {
    const int32_t pair[2] = {prev, id};
    auto both = options_.tokenizer->Decode(absl::Span<const int32_t>(pair, 2), false);
    auto first = options_.tokenizer->Decode(absl::Span<const int32_t>(pair, 1), false);
    if (both.ok() && first.ok() && both->compare(0, first->size(), *first) == 0) {
      return both->substr(first->size());
    }
  }
  auto text = options_.tokenizer->Decode(absl::Span<const int32_t>(&id, 1), false);
  return text.ok() ? *text : std::string();
}

void OpenAiResponder::AppendLogprobs(const v1::TokenChunk& chunk, Json* into, Choice* ch) {
  const bool chat = options_.endpoint == OpenAiEndpoint::kChatCompletions;
  if (into->is_null()) {
    *into = chat ? Json{{"content", Json::array()}}
                 : Json{{"tokens", Json::array()},
                        {"token_logprobs", Json::array()},
                        {"top_logprobs", Json::array()},
                        {"text_offset", Json::array()}};
  }
  for (int i = 0; i < chunk.logprobs_size(); ++i) {
    const v1::TokenLogprobs& lp = chunk.logprobs(i);
    const int32_t prev = ch->last_id >= 0 ? ch->last_id : last_prompt_id_;
    const std::string token = TokenText(prev, lp.chosen().token_id());
    if (chat) {
      Json top = Json::array();
      for (const v1::TokenLogprob& t : lp.top()) {
        const std::string s = TokenText(prev, t.token_id());
        top.push_back({{"token", s}, {"logprob", t.logprob()}, {"bytes", Bytes(s)}});
      }
      (*into)["content"].push_back({{"token", token},
                                    {"logprob", lp.chosen().logprob()},
                                    {"bytes", Bytes(token)},
                                    {"top_logprobs", top}});
    } else {
      Json top = Json::object();
      for (const v1::TokenLogprob& t : lp.top()) top[TokenText(prev, t.token_id())] = t.logprob();
      (*into)["tokens"].push_back(token);
      (*into)["token_logprobs"].push_back(lp.chosen().logprob());
      (*into)["top_logprobs"].push_back(top);
      (*into)["text_offset"].push_back(ch->text_offset);
      ch->text_offset += static_cast<int64_t>(token.size());
    }
    ch->last_id = lp.chosen().token_id();
  }
}

void OpenAiResponder::NoteFinal(const v1::GenerateFinal& f) {
  Choice& c = choice(f.index());
  c.finish_reason = FinishReasonLabel(f.finish_reason());
  prompt_tokens_ = f.usage().prompt_tokens();
  if (f.index() == 0 || cached_tokens_ == 0) cached_tokens_ = f.usage().cached_tokens();
  completion_tokens_ += f.usage().completion_tokens();
}

Json OpenAiResponder::Usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

Json OpenAiResponder::ChunkBase() const {
  const bool chat = options_.endpoint == OpenAiEndpoint::kChatCompletions;
  return {{"id", options_.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", options_.created},
          {"model", options_.model}};
}

void OpenAiResponder::NotePrompt(const v1::GenerateResponse& m) {
  if (m.prompt_token_ids_size() > 0) {
    last_prompt_id_ = m.prompt_token_ids(m.prompt_token_ids_size() - 1);
  }
}

std::optional<std::vector<ParsedToolCall>> OpenAiResponder::CallsOf(const Choice& ch,
                                                                    int32_t index) const {
  if (options_.endpoint != OpenAiEndpoint::kChatCompletions || !options_.tools.returns_calls() ||
      ch.finish_reason != "stop") {
    return std::nullopt;
  }
  return ParseToolCalls(options_.tools, ch.text);
}

std::vector<Json> OpenAiResponder::StreamChunks(const v1::GenerateResponse& m) {
  NotePrompt(m);
  const bool chat = options_.endpoint == OpenAiEndpoint::kChatCompletions;
  std::vector<Json> out;
  Json c;
  const bool hold = chat && options_.tools.returns_calls();
  if (hold && m.has_chunk()) {
    // Tool calls are known only once the output is complete.
    choice(m.chunk().index()).text += m.chunk().text();
    return out;
  }
  if (hold && m.has_final()) {
    NoteFinal(m.final());
    const int32_t index = m.final().index();
    Choice& ch = choice(index);
    Json delta = {{"role", "assistant"}};
    std::string finish = ch.finish_reason;
    if (auto calls = CallsOf(ch, index); calls.has_value()) {
      delta["content"] = nullptr;
      delta["tool_calls"] = ToolCallsJson(*calls, absl::StrCat(options_.id, "_", index), true,
                                          options_.tools.short_ids);
      finish = "tool_calls";
    } else {
      delta["content"] = ch.text;
    }
    Json body = ChunkBase();
    body["choices"] = Json::array(
        {{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    if (options_.include_usage) body["usage"] = nullptr;
    out.push_back(std::move(body));
    Json last = ChunkBase();
    last["choices"] = Json::array({{{"index", index},
                                    {"delta", Json::object()},
                                    {"logprobs", nullptr},
                                    {"finish_reason", finish}}});
    if (options_.include_usage) last["usage"] = nullptr;
    out.push_back(std::move(last));
    return out;
  }
  if (m.has_chunk()) {
    const v1::TokenChunk& chunk = m.chunk();
    Choice& ch = choice(chunk.index());
    c = {{"index", chunk.index()}};
    if (chat) {
      Json delta = Json::object();
      if (!ch.started) delta["role"] = "assistant";
      ch.started = true;
      delta["content"] = chunk.text();
      c["delta"] = delta;
    } else {
      c["text"] = chunk.text();
    }
    if (options_.logprobs && chunk.logprobs_size() > 0) {
      Json lp;
      AppendLogprobs(chunk, &lp, &ch);
      c["logprobs"] = lp;
    } else {
      c["logprobs"] = nullptr;
    }
    c["finish_reason"] = nullptr;
  } else if (m.has_final()) {
    NoteFinal(m.final());
    Choice& ch = choice(m.final().index());
    c = {{"index", m.final().index()}, {"logprobs", nullptr}};
    if (chat) {
      Json delta = Json::object();
      if (!ch.started) delta["role"] = "assistant";
      ch.started = true;
      c["delta"] = delta;
    } else {
      c["text"] = "";
    }
    c["finish_reason"] = ch.finish_reason;
  } else {
    return out;
  }
  Json chunk = ChunkBase();
  chunk["choices"] = Json::array({c});
  if (options_.include_usage) chunk["usage"] = nullptr;
  out.push_back(std::move(chunk));
  return out;
}

Json OpenAiResponder::UsageChunk() const {
  Json chunk = ChunkBase();
  chunk["choices"] = Json::array();
  chunk["usage"] = Usage();
  return chunk;
}

void OpenAiResponder::Accumulate(const v1::GenerateResponse& m) {
  NotePrompt(m);
  if (m.has_chunk()) {
    Choice& ch = choice(m.chunk().index());
    ch.text += m.chunk().text();
    if (options_.logprobs) AppendLogprobs(m.chunk(), &ch.logprobs, &ch);
  } else if (m.has_final()) {
    NoteFinal(m.final());
  }
}

Json OpenAiResponder::Complete() const {
  const bool chat = options_.endpoint == OpenAiEndpoint::kChatCompletions;
  Json choices = Json::array();
  for (const auto& [index, ch] : choices_) {
    Json c = {{"index", index}};
    std::optional<std::vector<ParsedToolCall>> calls = CallsOf(ch, index);
    if (chat && calls.has_value()) {
      c["message"] = {{"role", "assistant"},
                      {"content", nullptr},
                      {"tool_calls", ToolCallsJson(*calls, absl::StrCat(options_.id, "_", index),
                                                   false, options_.tools.short_ids)}};
    } else if (chat) {
      c["message"] = {{"role", "assistant"}, {"content", ch.text}};
    } else {
      c["text"] = ch.text;
    }
    c["logprobs"] = options_.logprobs && !ch.logprobs.is_null() ? ch.logprobs : Json(nullptr);
    c["finish_reason"] = calls.has_value()          ? Json("tool_calls")
                         : ch.finish_reason.empty() ? Json(nullptr)
                                                    : Json(ch.finish_reason);
    choices.push_back(std::move(c));
  }
  return {{"id", options_.id},           {"object", chat ? "chat.completion" : "text_completion"},
          {"created", options_.created}, {"model", options_.model},
          {"choices", choices},          {"usage", Usage()}};
}

}  // namespace tandem
