#include "router/http/chat_output.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// The named function's call: the whole answer is its arguments object.
ToolCallParse NamedCall(const ChatOutputOptions& o, const std::string& text, bool final) {
  ToolCallParse p;
  ToolCallPart part;
  part.name = o.named;
  part.arguments = text;
  part.complete = final;
  if (final) {
    const auto v = nlohmann::ordered_json::parse(text, nullptr, false);
    if (!v.is_object()) {
      p.content = text;
      p.malformed = true;
      return p;
    }
  }
  p.calls.push_back(std::move(part));
  return p;
}

ToolCallParse ParseAnswer(const ChatOutputOptions& o, const std::string& text, bool final) {
  if (!o.named.empty()) return NamedCall(o, text, final);
  return ParseToolCallText(o.parser, text, final, o.tool_names, &o.tool_parameters);
}

}  // namespace

std::string ToolCallId(const ChatOutputOptions& o, size_t i, const std::string& model_id) {
  if (!model_id.empty()) return model_id;
  std::string id = absl::StrCat("call_", o.id_base, "_", i);
  if (!o.short_ids) return id;
  // 9 alphanumeric characters (FNV-1a of the long id), as Mistral's templates check.
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : id) h = (h ^ ch) * 1099511628211ull;
  id.clear();
  for (int k = 0; k < 9; ++k, h /= 62) id.push_back(kAlphabet[h % 62]);
  return id;
}

ChatOutput::ChatOutput(ChatOutputOptions options)
    : options_(std::move(options)), splitter_(options_.reasoning, options_.start) {}

ChatDelta ChatOutput::Feed(const std::string& text) {
  ChatDelta out;
  std::string answer;
  splitter_.Feed(text, &out.reasoning, &answer);
  if (!options_.tools) {
    out.content = std::move(answer);
    return out;
  }
  if (answer.empty()) return out;
  answer_ += answer;
  DiffCalls(false, &out);
  return out;
}

ChatDelta ChatOutput::Finish() {
  ChatDelta out;
  std::string answer;
  splitter_.Finish(&out.reasoning, &answer);
  if (!options_.tools) {
    out.content = std::move(answer);
    return out;
  }
  answer_ += answer;
  DiffCalls(true, &out);
  return out;
}

void ChatOutput::DiffCalls(bool final, ChatDelta* out) {
  const ToolCallParse p = ParseAnswer(options_, answer_, final);
  if (p.malformed) {
    // Nothing of the calls was sent: the rest of the text is content. (Calls already sent
    // stay; no further delta adds to them.)
    if (calls_.empty() && p.content.size() > content_sent_) {
      out->content += p.content.substr(content_sent_);
      content_sent_ = p.content.size();
    }
    return;
  }
  if (p.content.size() > content_sent_) {
    out->content += p.content.substr(content_sent_);
    content_sent_ = p.content.size();
  }
  for (size_t i = 0; i < p.calls.size(); ++i) {
    const ToolCallPart& part = p.calls[i];
    if (part.name.empty()) break;  // its name is still forming
    if (i >= calls_.size()) calls_.emplace_back();
    CallState& st = calls_[i];
    if (!st.first_sent) {
      ToolCallDelta d;
      d.index = static_cast<int32_t>(i);
      d.first = true;
      d.id = ToolCallId(options_, i, part.id);
      d.name = part.name;
      out->calls.push_back(std::move(d));
      st.first_sent = true;
    }
    if (st.args_done) continue;
    std::string fragment;
    if (part.streamable && part.arguments.size() > st.args_sent) {
      fragment = part.arguments.substr(st.args_sent);
      st.args_sent = part.arguments.size();
    } else if (!part.streamable && part.complete) {
      fragment = part.arguments;
    }
    if (part.complete) st.args_done = true;
    if (!fragment.empty()) {
      ToolCallDelta d;
      d.index = static_cast<int32_t>(i);
      d.arguments = std::move(fragment);
      out->calls.push_back(std::move(d));
    }
  }
  if (final && !p.trailing.empty()) out->content += p.trailing;
}

ChatMessage ChatOutput::Whole(const ChatOutputOptions& options, const std::string& text) {
  ChatMessage m;
  ReasoningSplitter splitter(options.reasoning, options.start);
  std::string reasoning, answer;
  splitter.Feed(text, &reasoning, &answer);
  splitter.Finish(&reasoning, &answer);
  if (options.reasoning != ReasoningParser::kNone && splitter.reasoned()) {
    m.reasoning = std::move(reasoning);
  }
  if (!options.tools) {
    m.content = std::move(answer);
    return m;
  }
  const ToolCallParse p = ParseAnswer(options, answer, true);
  std::string content = p.content + p.trailing;
  for (size_t i = 0; i < p.calls.size(); ++i) {
    m.calls.push_back(
        {ToolCallId(options, i, p.calls[i].id), p.calls[i].name, p.calls[i].arguments});
  }
  if (!content.empty() || m.calls.empty()) m.content = std::move(content);
  return m;
}

}  // namespace tandem
