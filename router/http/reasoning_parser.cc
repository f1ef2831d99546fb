#include "router/http/reasoning_parser.h"

#include "absl/strings/str_cat.h"
#include "router/http/json_scan.h"

namespace tandem {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

size_t SkipSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsSpace(s[pos])) ++pos;
  return pos;
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace

absl::StatusOr<ReasoningParser> ReasoningParserByName(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  if (name == "mistral") return ReasoningParser::kMistral;
  if (name == "none") return ReasoningParser::kNone;
  return absl::InvalidArgumentError(absl::StrCat("--reasoning-parser: unknown parser '",
                                                 std::string(name),
                                                 "' (auto, deepseek_r1, qwen3, mistral, none)"));
}

const char* ReasoningParserName(ReasoningParser parser) {
  switch (parser) {
    case ReasoningParser::kNone:
      return "none";
    case ReasoningParser::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningParser::kQwen3:
      return "qwen3";
    case ReasoningParser::kMistral:
      return "mistral";
  }
  return "none";
}

ReasoningParser ReasoningParserOfTemplate(std::string_view source) {
  auto has = [&](std::string_view what) { return source.find(what) != std::string_view::npos; };
  if (has("[THINK]")) return ReasoningParser::kMistral;
  if (!has("<think>") && !has("</think>")) return ReasoningParser::kNone;
  if (has("<｜Assistant｜>")) return ReasoningParser::kDeepSeekR1;
  return ReasoningParser::kQwen3;
}

ReasoningTags TagsOf(ReasoningParser parser) {
  if (parser == ReasoningParser::kMistral) return {"[THINK]", "[/THINK]"};
  return {"<think>", "</think>"};
}

ReasoningStart ReasoningStartOf(ReasoningParser parser, std::string_view prompt,
                                std::string_view continued) {
  if (parser == ReasoningParser::kNone) return ReasoningStart::kAnswer;
  const ReasoningTags tags = TagsOf(parser);
  if (!continued.empty()) {
    // Continuing an assistant message: inside a block it opened and did not close.
    const size_t open = continued.rfind(tags.open);
    const size_t close = continued.rfind(tags.close);
    if (open != std::string_view::npos && (close == std::string_view::npos || close < open)) {
      return ReasoningStart::kInReasoning;
    }
    if (close != std::string_view::npos) return ReasoningStart::kAnswer;
  }
  const std::string_view tail = TrimRight(prompt);
  if (EndsWith(tail, tags.close)) return ReasoningStart::kAnswer;
  if (EndsWith(tail, tags.open)) return ReasoningStart::kInReasoning;
  return parser == ReasoningParser::kDeepSeekR1 ? ReasoningStart::kInReasoning
                                                : ReasoningStart::kMayOpen;
}

ReasoningSplitter::ReasoningSplitter(ReasoningParser parser, ReasoningStart start)
    : tags_(TagsOf(parser)),
      state_(start == ReasoningStart::kAnswer ? State::kAnswer : State::kStart),
      in_block_at_start_(start == ReasoningStart::kInReasoning),
      reasoned_(start == ReasoningStart::kInReasoning) {}

void ReasoningSplitter::Feed(std::string_view text, std::string* reasoning, std::string* answer) {
  pending_.append(text);
  Run(false, reasoning, answer);
}

void ReasoningSplitter::Finish(std::string* reasoning, std::string* answer) {
  Run(true, reasoning, answer);
}

void ReasoningSplitter::Run(bool final, std::string* reasoning, std::string* answer) {
  while (!pending_.empty()) {
    switch (state_) {
      case State::kStart: {
        // Leading whitespace, then maybe the open tag.
        const size_t at = SkipSpace(pending_, 0);
        const std::string_view rest = std::string_view(pending_).substr(at);
        if (rest.substr(0, tags_.open.size()) == tags_.open) {
          reasoned_ = true;
          pending_.erase(0, at + tags_.open.size());
          state_ = State::kReasoning;
          break;
        }
        if (!final && (rest.empty() || tags_.open.substr(0, rest.size()) == rest)) return;
        state_ = in_block_at_start_ ? State::kReasoning : State::kAnswer;
        break;
      }
      case State::kReasoning: {
        const size_t close = pending_.find(tags_.close);
        if (close == std::string::npos) {
          const size_t held = final ? 0 : PartialMarkerSuffix(pending_, tags_.close);
          reasoning->append(pending_, 0, pending_.size() - held);
          pending_.erase(0, pending_.size() - held);
          return;
        }
        reasoning->append(pending_, 0, close);
        pending_.erase(0, close + tags_.close.size());
        state_ = State::kAnswerStart;
        break;
      }
      case State::kAnswerStart: {
        const size_t at = SkipSpace(pending_, 0);
        pending_.erase(0, at);
        if (pending_.empty()) return;
        state_ = State::kAnswer;
        break;
      }
      case State::kAnswer:
        answer->append(pending_);
        pending_.clear();
        return;
    }
  }
}

}  // namespace tandem
