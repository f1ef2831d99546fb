#include "router/http/openai_response.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "common/tokenizer/tokenizer.h"
#include "router/finish_reason.h"

namespace tandem {

using Json = nlohmann::ordered_json;

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
    if (options_.return_token_ids) {
      prompt_ids_.assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
    }
  }
}

std::string OpenAiResponder::ChunkText(const v1::TokenChunk& chunk) const {
  std::string text = chunk.text();
  if (!options_.drop_eos_text || options_.tokenizer == nullptr || chunk.token_ids_size() == 0 ||
      !options_.tokenizer->eos_id().has_value() ||
      chunk.token_ids(chunk.token_ids_size() - 1) != *options_.tokenizer->eos_id()) {
    return text;
  }
  const std::string_view eos = options_.tokenizer->IdToToken(*options_.tokenizer->eos_id());
  if (text.size() >= eos.size() && text.compare(text.size() - eos.size(), eos.size(), eos) == 0) {
    text.resize(text.size() - eos.size());
  }
  return text;
}

ChatOutputOptions OpenAiResponder::ChatOptions(int32_t index) const {
  ChatOutputOptions o = options_.chat;
  o.id_base = absl::StrCat(options_.id, "_", index);
  return o;
}

Json OpenAiResponder::ChatChunk(int32_t index, Choice& ch, const ChatDelta& d, Json logprobs,
                                const std::vector<int32_t>* token_ids) {
  Json delta = Json::object();
  if (!ch.started) delta["role"] = "assistant";
  ch.started = true;
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty() || (d.reasoning.empty() && d.calls.empty())) delta["content"] = d.content;
  if (!d.calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& c : d.calls) {
      Json j = {{"index", c.index}};
      if (c.first) {
        j["id"] = c.id;
        j["type"] = "function";
        j["function"] = {{"name", c.name}, {"arguments", ""}};
      } else {
        j["function"] = {{"arguments", c.arguments}};
      }
      calls.push_back(std::move(j));
    }
    delta["tool_calls"] = std::move(calls);
  }
  Json c = {{"index", index},
            {"delta", std::move(delta)},
            {"logprobs", std::move(logprobs)},
            {"finish_reason", nullptr}};
  if (token_ids != nullptr) c["token_ids"] = *token_ids;
  Json chunk = ChunkBase();
  chunk["choices"] = Json::array({std::move(c)});
  if (options_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::vector<Json> OpenAiResponder::StreamChunks(const v1::GenerateResponse& m) {
  NotePrompt(m);
  const bool chat = options_.endpoint == OpenAiEndpoint::kChatCompletions;
  std::vector<Json> out;
  auto with_prompt_ids = [&](Json chunk) {
    if (options_.return_token_ids && !prompt_ids_sent_) {
      prompt_ids_sent_ = true;
      chunk["prompt_token_ids"] = prompt_ids_;
    }
    out.push_back(std::move(chunk));
  };
  if (m.has_chunk()) {
    const v1::TokenChunk& chunk = m.chunk();
    Choice& ch = choice(chunk.index());
    Json lp = nullptr;
    if (options_.logprobs && chunk.logprobs_size() > 0) AppendLogprobs(chunk, &lp, &ch);
    std::vector<int32_t> ids(chunk.token_ids().begin(), chunk.token_ids().end());
    if (chat) {
      if (ch.output == nullptr)
        ch.output = std::make_unique<ChatOutput>(ChatOptions(chunk.index()));
      const ChatDelta d = ch.output->Feed(ChunkText(chunk));
      // Text held back (a tag or call forming) sends nothing yet, unless logprobs or token
      // ids must go out with their tokens.
      if (d.empty() && ch.started && lp.is_null() && !options_.return_token_ids) return out;
      with_prompt_ids(ChatChunk(chunk.index(), ch, d, std::move(lp),
                                options_.return_token_ids ? &ids : nullptr));
      return out;
    }
    Json c = {{"index", chunk.index()},
              {"text", chunk.text()},
              {"logprobs", std::move(lp)},
              {"finish_reason", nullptr}};
    if (options_.return_token_ids) c["token_ids"] = ids;
    Json body = ChunkBase();
    body["choices"] = Json::array({std::move(c)});
    if (options_.include_usage) body["usage"] = nullptr;
    with_prompt_ids(std::move(body));
    return out;
  }
  if (!m.has_final()) return out;
  NoteFinal(m.final());
  const int32_t index = m.final().index();
  Choice& ch = choice(index);
  std::string finish = ch.finish_reason;
  Json c = {{"index", index}, {"logprobs", nullptr}};
  if (chat) {
    if (ch.output == nullptr) ch.output = std::make_unique<ChatOutput>(ChatOptions(index));
    const ChatDelta d = ch.output->Finish();
    if (!d.empty()) with_prompt_ids(ChatChunk(index, ch, d, nullptr, nullptr));
    if (ch.output->streamed_calls() && finish == "stop") finish = "tool_calls";
    Json delta = Json::object();
    if (!ch.started) delta["role"] = "assistant";
    ch.started = true;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = "";
  }
  c["finish_reason"] = finish;
  Json body = ChunkBase();
  body["choices"] = Json::array({std::move(c)});
  if (options_.include_usage) body["usage"] = nullptr;
  with_prompt_ids(std::move(body));
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
    ch.text += ChunkText(m.chunk());
    if (options_.return_token_ids) {
      ch.token_ids.insert(ch.token_ids.end(), m.chunk().token_ids().begin(),
                          m.chunk().token_ids().end());
    }
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
    Json finish = ch.finish_reason.empty() ? Json(nullptr) : Json(ch.finish_reason);
    if (chat) {
      const ChatMessage m = ChatOutput::Whole(ChatOptions(index), ch.text);
      Json message = {{"role", "assistant"}};
      message["content"] = m.content.has_value() ? Json(*m.content) : Json(nullptr);
      if (options_.chat.reasoning != ReasoningParser::kNone) {
        message["reasoning_content"] = m.reasoning.has_value() ? Json(*m.reasoning) : Json(nullptr);
      }
      if (!m.calls.empty()) {
        Json calls = Json::array();
        for (const ChatToolCall& call : m.calls) {
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
        if (ch.finish_reason == "stop") finish = "tool_calls";
      }
      c["message"] = std::move(message);
    } else {
      c["text"] = ch.text;
    }
    c["logprobs"] = options_.logprobs && !ch.logprobs.is_null() ? ch.logprobs : Json(nullptr);
    c["finish_reason"] = std::move(finish);
    if (options_.return_token_ids) c["token_ids"] = ch.token_ids;
    choices.push_back(std::move(c));
  }
  Json out = {
      {"id", options_.id},           {"object", chat ? "chat.completion" : "text_completion"},
      {"created", options_.created}, {"model", options_.model},
      {"choices", choices},          {"usage", Usage()}};
  if (options_.return_token_ids) out["prompt_token_ids"] = prompt_ids_;
  return out;
}

}  // namespace tandem
