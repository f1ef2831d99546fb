#include "router/http/tool_parsers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/http/json_scan.h"
#include "router/http/pythonic_calls.h"
#include "router/http/tagged_tool_calls.h"

namespace tandem {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kPythonStart = "<|python_start|>";
constexpr std::string_view kPythonEnd = "<|python_end|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kFunctools = "functools[";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kFenceJson = "```json";
constexpr std::string_view kFence = "```";

bool At(std::string_view s, size_t pos, std::string_view what) {
  return s.substr(pos, what.size()) == what;
}

using Region = CallRegion;

// One parse in progress: the text, whether the output ended, the tools, and what was found.
struct Ctx {
  std::string_view s;
  bool final;
  const std::vector<std::string>& tools;
  ToolCallParse out;

  bool Known(const std::string& name) const {
    return std::find(tools.begin(), tools.end(), name) != tools.end();
  }

  // `arguments` text of a complete call, checked: a JSON object (or a string holding one, as
  // some models write it). False when it is neither.
  static bool CheckedArguments(std::string_view raw, std::string* out) {
    const OrderedJson v = OrderedJson::parse(raw, nullptr, false);
    if (v.is_object()) {
      *out = std::string(raw);
      return true;
    }
    if (v.is_string()) {
      const OrderedJson inner = OrderedJson::parse(v.get<std::string>(), nullptr, false);
      if (!inner.is_object()) return false;
      *out = v.get<std::string>();
      return true;
    }
    return false;
  }

  // A JSON call object at `pos`; appends its part. Sets *end past it when complete.
  Region JsonCall(size_t pos, size_t* end) {
    const JsonCallScan c = ScanJsonCall(s, pos, final);
    if (c.error || (c.has_name && !Known(c.name))) return Region::kError;
    ToolCallPart part;
    if (c.has_name) part.name = c.name;
    if (c.has_args) {
      part.streamable = s[c.args_begin] != '"';
      if (part.streamable)
        part.arguments = std::string(s.substr(c.args_begin, c.args_end - c.args_begin));
    }
    if (!c.complete) {
      out.calls.push_back(std::move(part));
      return Region::kPartial;
    }
    const OrderedJson whole = OrderedJson::parse(s.substr(pos, c.end - pos), nullptr, false);
    if (!whole.is_object() || !c.has_name) return Region::kError;
    if (c.has_args) {
      if (!CheckedArguments(s.substr(c.args_begin, c.args_end - c.args_begin), &part.arguments)) {
        return Region::kError;
      }
    } else {
      part.arguments = "{}";
    }
    part.complete = true;
    out.calls.push_back(std::move(part));
    *end = c.end;
    return Region::kDone;
  }

  // A JSON array of call objects at `pos` ('[').
  Region JsonCallArray(size_t pos, size_t* end) {
    size_t i = SkipJsonSpace(s, pos + 1);
    if (i >= s.size()) return Region::kPartial;
    if (s[i] == ']') return Region::kError;  // no calls
    while (true) {
      if (s[i] != '{') return Region::kError;
      size_t call_end = 0;
      const Region r = JsonCall(i, &call_end);
      if (r != Region::kDone) return r;
      i = SkipJsonSpace(s, call_end);
      if (i >= s.size()) return Region::kPartial;
      if (s[i] == ']') {
        *end = i + 1;
        return Region::kDone;
      }
      if (s[i] != ',') return Region::kError;
      i = SkipJsonSpace(s, i + 1);
      if (i >= s.size()) return Region::kPartial;
    }
  }

  // A call object or an array of them.
  Region JsonCalls(size_t pos, size_t* end) {
    if (s[pos] == '[') return JsonCallArray(pos, end);
    return JsonCall(pos, end);
  }

  // The content before the region at `start`, or (no region yet) the text that cannot be the
  // start of `marker` forming.
  void ContentBefore(size_t start) { out.content = std::string(s.substr(0, start)); }
  void NoRegion(std::string_view marker) {
    const size_t held = final ? 0 : PartialMarkerSuffix(s, marker);
    out.content = std::string(s.substr(0, s.size() - held));
  }
  // Ends the region at `pos`: what follows is trailing text (final) or held.
  void Trailing(size_t pos) {
    if (final) out.trailing = std::string(s.substr(std::min(pos, s.size())));
  }

  // Finishes a parse whose region ended in `r` at `pos`.
  ToolCallParse Finish(Region r, size_t pos) {
    if (r == Region::kDone) {
      Trailing(pos);
      return std::move(out);
    }
    if (final || r == Region::kError) {
      // A region that never completes is content once the output ends; while streaming, an
      // error keeps the complete calls found so far and waits for the end.
      if (final) {
        ToolCallParse m;
        m.content = std::string(s);
        m.malformed = true;
        return m;
      }
      while (!out.calls.empty() && !out.calls.back().complete) out.calls.pop_back();
    }
    return std::move(out);
  }
};

ToolCallParse ParseHermes(Ctx& c) {
  const std::string_view s = c.s;
  const size_t start = s.find(kHermesOpen);
  if (start == std::string_view::npos) {
    c.NoRegion(kHermesOpen);
    return std::move(c.out);
  }
  c.ContentBefore(start);
  size_t pos = start;
  while (true) {
    pos = SkipJsonSpace(s, pos + kHermesOpen.size());
    if (pos >= s.size()) return c.Finish(Region::kPartial, pos);
    size_t end = 0;
    const Region r = s[pos] == '{' ? c.JsonCall(pos, &end) : Region::kError;
    if (r != Region::kDone) return c.Finish(r, pos);
    pos = SkipJsonSpace(s, end);
    if (At(s, pos, kHermesClose)) {
      pos = SkipJsonSpace(s, pos + kHermesClose.size());
    } else if (pos >= s.size() || kHermesClose.substr(0, s.size() - pos) == s.substr(pos)) {
      // The closing tag is forming, or (final) the output ended without it.
      if (!c.final) return c.Finish(Region::kPartial, pos);
      return c.Finish(Region::kDone, s.size());
    } else {
      return c.Finish(Region::kError, pos);
    }
    if (At(s, pos, kHermesOpen)) continue;
    if (!c.final && kHermesOpen.substr(0, s.size() - pos) == s.substr(pos)) {
      return c.Finish(Region::kPartial, pos);  // another call may be starting
    }
    return c.Finish(Region::kDone, pos);
  }
}

// Llama 3.x JSON: [<|python_tag|>]{...} with ';' between calls; also the pythonic list.
ToolCallParse ParseLlama3Json(Ctx& c) {
  const std::string_view s = c.s;
  size_t pos = SkipJsonSpace(s, 0);
  if (At(s, pos, kPythonTag)) pos = SkipJsonSpace(s, pos + kPythonTag.size());
  if (pos >= s.size() || (!c.final && kPythonTag.substr(0, s.size() - pos) == s.substr(pos))) {
    if (c.final) c.out.content = std::string(s);
    return std::move(c.out);  // nothing decided yet
  }
  if (s[pos] == '[') {
    size_t end = 0;
    const Region r = ParsePythonicCalls(s, pos, c.final, c.tools, &c.out.calls, &end);
    if (r == Region::kNotCalls) {
      c.out.calls.clear();
      c.out.content = std::string(s);
      return std::move(c.out);
    }
    return c.Finish(r, end);
  }
  if (s[pos] != '{') {
    c.out.content = std::string(s);
    return std::move(c.out);
  }
  while (true) {
    size_t end = 0;
    const Region r = c.JsonCall(pos, &end);
    if (r != Region::kDone) return c.Finish(r, pos);
    pos = SkipJsonSpace(s, end);
    if (pos < s.size() && s[pos] == ';') {
      pos = SkipJsonSpace(s, pos + 1);
      if (pos >= s.size()) return c.Finish(Region::kPartial, pos);
      if (s[pos] != '{') return c.Finish(Region::kError, pos);
      continue;
    }
    if (pos >= s.size() && !c.final) return c.Finish(Region::kPartial, pos);
    return c.Finish(Region::kDone, pos);
  }
}

ToolCallParse ParsePythonic(Ctx& c) {
  const std::string_view s = c.s;
  size_t pos = SkipJsonSpace(s, 0);
  if (At(s, pos, kPythonStart)) pos = SkipJsonSpace(s, pos + kPythonStart.size());
  if (pos >= s.size() || (!c.final && kPythonStart.substr(0, s.size() - pos) == s.substr(pos))) {
    if (c.final) c.out.content = std::string(s);
    return std::move(c.out);
  }
  size_t end = 0;
  const Region r = s[pos] == '[' ? ParsePythonicCalls(s, pos, c.final, c.tools, &c.out.calls, &end)
                                 : Region::kNotCalls;
  if (r == Region::kNotCalls) {
    c.out.calls.clear();
    c.out.content = std::string(s);
    return std::move(c.out);
  }
  if (r == Region::kDone) {
    end = SkipJsonSpace(s, end);
    if (At(s, end, kPythonEnd)) end += kPythonEnd.size();
  }
  return c.Finish(r, end);
}

ToolCallParse ParseMistral(Ctx& c) {
  const std::string_view s = c.s;
  size_t start = s.find(kMistralCalls);
  if (start == std::string_view::npos) {
    // Decoded without special tokens, v0.3's marker is gone: a leading array of calls.
    const size_t first = SkipJsonSpace(s, 0);
    const size_t second = first < s.size() ? SkipJsonSpace(s, first + 1) : s.size();
    if (first < s.size() && s[first] == '[' && (second >= s.size() || s[second] == '{')) {
      size_t end = 0;
      const Region r = c.JsonCallArray(first, &end);
      if (r != Region::kError || !c.final) return c.Finish(r, end);
      c.out = ToolCallParse();
    }
    c.NoRegion(kMistralCalls);
    return std::move(c.out);
  }
  c.ContentBefore(start);
  size_t pos = start;
  while (true) {
    pos = SkipJsonSpace(s, pos + kMistralCalls.size());
    if (pos >= s.size()) return c.Finish(Region::kPartial, pos);
    size_t end = 0;
    if (s[pos] == '[') {  // v0.3: a JSON array
      const Region r = c.JsonCallArray(pos, &end);
      if (r != Region::kDone) return c.Finish(r, pos);
      pos = SkipJsonSpace(s, end);
    } else {  // name[CALL_ID]id[ARGS]{...} or name[ARGS]{...}
      const size_t args = s.find(kMistralArgs, pos);
      const size_t id_at = s.find(kMistralCallId, pos);
      ToolCallPart part;
      size_t name_end = std::min(args, id_at);
      if (name_end == std::string_view::npos) {
        // The name is still forming (no marker may start inside a name).
        if (c.final || s.find('[', pos) != std::string_view::npos &&
                           PartialMarkerSuffix(s, kMistralArgs) == 0 &&
                           PartialMarkerSuffix(s, kMistralCallId) == 0) {
          return c.Finish(Region::kError, pos);
        }
        return c.Finish(Region::kPartial, pos);
      }
      part.name = std::string(s.substr(pos, name_end - pos));
      if (!c.Known(part.name)) return c.Finish(Region::kError, pos);
      if (id_at < args) {
        // The call is announced once its id is complete too.
        if (args == std::string_view::npos) {
          return c.Finish(c.final ? Region::kError : Region::kPartial, pos);
        }
        part.id = std::string(
            s.substr(id_at + kMistralCallId.size(), args - id_at - kMistralCallId.size()));
      }
      const size_t value = SkipJsonSpace(s, args + kMistralArgs.size());
      const JsonValueScan v = ScanJsonValue(s, value, c.final);
      if (v.error || (value < s.size() && s[value] != '{')) return c.Finish(Region::kError, pos);
      part.arguments = std::string(s.substr(value, v.end - value));
      if (!v.complete) {
        c.out.calls.push_back(std::move(part));
        return c.Finish(Region::kPartial, pos);
      }
      if (!Ctx::CheckedArguments(part.arguments, &part.arguments)) {
        return c.Finish(Region::kError, pos);
      }
      part.complete = true;
      c.out.calls.push_back(std::move(part));
      pos = SkipJsonSpace(s, v.end);
    }
    if (At(s, pos, kMistralCalls)) continue;
    if (!c.final && kMistralCalls.substr(0, s.size() - pos) == s.substr(pos)) {
      return c.Finish(Region::kPartial, pos);
    }
    return c.Finish(Region::kDone, pos);
  }
}

ToolCallParse ParsePhi4Mini(Ctx& c) {
  const std::string_view s = c.s;
  const size_t start = s.find(kFunctools);
  if (start == std::string_view::npos) {
    c.NoRegion(kFunctools);
    return std::move(c.out);
  }
  c.ContentBefore(start);
  size_t end = 0;
  const Region r = c.JsonCallArray(start + kFunctools.size() - 1, &end);
  return c.Finish(r, end);
}

ToolCallParse ParseDeepSeek(Ctx& c) {
  const std::string_view s = c.s;
  const size_t start = s.find(kDsCallsBegin);
  if (start == std::string_view::npos) {
    c.NoRegion(kDsCallsBegin);
    return std::move(c.out);
  }
  c.ContentBefore(start);
  size_t pos = SkipJsonSpace(s, start + kDsCallsBegin.size());
  while (true) {
    if (pos >= s.size() ||
        (!At(s, pos, kDsCallBegin) && kDsCallBegin.substr(0, s.size() - pos) == s.substr(pos))) {
      return c.Finish(Region::kPartial, pos);
    }
    if (!At(s, pos, kDsCallBegin)) return c.Finish(Region::kError, pos);
    pos += kDsCallBegin.size();
    const size_t sep = s.find(kDsSep, pos);
    if (sep == std::string_view::npos) return c.Finish(Region::kPartial, pos);
    ToolCallPart part;
    std::string first(s.substr(pos, sep - pos));
    pos = sep + kDsSep.size();
    size_t value = pos;
    bool fenced = false;
    if (first == "function") {  // V3 / R1: the name, then a ```json fence
      const size_t nl = s.find('\n', pos);
      if (nl == std::string_view::npos) return c.Finish(Region::kPartial, pos);
      part.name = std::string(s.substr(pos, nl - pos));
      value = nl + 1;
      if (!At(s, value, kFenceJson)) {
        if (s.size() - value < kFenceJson.size()) return c.Finish(Region::kPartial, pos);
        return c.Finish(Region::kError, pos);
      }
      value = SkipJsonSpace(s, value + kFenceJson.size());
      fenced = true;
    } else {  // V3.1: the name, then the arguments
      part.name = std::move(first);
      value = SkipJsonSpace(s, value);
    }
    if (!c.Known(part.name)) return c.Finish(Region::kError, pos);
    const JsonValueScan v = ScanJsonValue(s, value, c.final);
    if (v.error || (value < s.size() && s[value] != '{')) return c.Finish(Region::kError, pos);
    part.arguments = std::string(s.substr(value, v.end - value));
    if (!v.complete) {
      c.out.calls.push_back(std::move(part));
      return c.Finish(Region::kPartial, pos);
    }
    if (!Ctx::CheckedArguments(part.arguments, &part.arguments)) {
      return c.Finish(Region::kError, pos);
    }
    part.complete = true;
    c.out.calls.push_back(std::move(part));
    pos = SkipJsonSpace(s, v.end);
    if (fenced) {
      if (pos + kFence.size() > s.size()) return c.Finish(Region::kPartial, pos);
      if (!At(s, pos, kFence)) return c.Finish(Region::kError, pos);
      pos = SkipJsonSpace(s, pos + kFence.size());
    }
    if (pos + kDsCallEnd.size() > s.size() &&
        kDsCallEnd.substr(0, s.size() - pos) == s.substr(pos)) {
      return c.Finish(c.final ? Region::kDone : Region::kPartial, s.size());
    }
    if (!At(s, pos, kDsCallEnd)) return c.Finish(Region::kError, pos);
    pos = SkipJsonSpace(s, pos + kDsCallEnd.size());
    if (At(s, pos, kDsCallsEnd)) return c.Finish(Region::kDone, pos + kDsCallsEnd.size());
    if (At(s, pos, kDsCallBegin)) continue;
    if (!c.final && (kDsCallsEnd.substr(0, s.size() - pos) == s.substr(pos) ||
                     kDsCallBegin.substr(0, s.size() - pos) == s.substr(pos))) {
      return c.Finish(Region::kPartial, pos);
    }
    return c.Finish(Region::kDone, pos);  // the closing marker is optional at the end
  }
}

// No family marker: a JSON call object or array at the start, or in a ```json fence (with text
// before it, as Gemma-style prompts ask).
ToolCallParse ParseJson(Ctx& c) {
  const std::string_view s = c.s;
  const size_t first = SkipJsonSpace(s, 0);
  if (first < s.size() && (s[first] == '{' || s[first] == '[')) {
    size_t end = 0;
    const Region r = c.JsonCalls(first, &end);
    if (r == Region::kError || (c.final && r != Region::kDone)) {
      c.out = ToolCallParse();
      c.out.content = std::string(s);  // plain JSON that is not a call: an answer
      return std::move(c.out);
    }
    return c.Finish(r, end);
  }
  const size_t fence = s.find(kFenceJson);
  if (fence == std::string_view::npos) {
    c.NoRegion(kFenceJson);
    return std::move(c.out);
  }
  const size_t body = SkipJsonSpace(s, fence + kFenceJson.size());
  if (body >= s.size()) {
    if (c.final)
      c.out.content = std::string(s);
    else
      c.ContentBefore(fence);
    return std::move(c.out);
  }
  size_t end = 0;
  const Region r = (s[body] == '{' || s[body] == '[') ? c.JsonCalls(body, &end) : Region::kError;
  if (r == Region::kError) {
    c.out = ToolCallParse();
    c.out.content = std::string(s);  // a JSON block that is no call: part of the answer
    return std::move(c.out);
  }
  c.ContentBefore(fence);
  if (r == Region::kDone) {
    end = SkipJsonSpace(s, end);
    if (At(s, end, kFence)) {
      end += kFence.size();
    } else if (!c.final && kFence.substr(0, s.size() - end) == s.substr(end)) {
      return c.Finish(Region::kPartial, end);
    }
  }
  return c.Finish(r, end);
}

}  // namespace

absl::StatusOr<ToolCallParser> ToolCallParserByName(std::string_view name) {
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json" || name == "llama4_json") return ToolCallParser::kLlama3Json;
  if (name == "pythonic" || name == "llama4_pythonic") return ToolCallParser::kPythonic;
  if (name == "mistral") return ToolCallParser::kMistral;
  if (name == "phi4_mini_json") return ToolCallParser::kPhi4MiniJson;
  if (name == "deepseek_v3" || name == "deepseek_v31") return ToolCallParser::kDeepSeekV3;
  if (name == "json") return ToolCallParser::kJson;
  if (name == "qwen3_coder") return ToolCallParser::kQwen3Coder;
  if (name == "glm45" || name == "glm4_moe") return ToolCallParser::kGlm45;
  if (name == "minimax_m2") return ToolCallParser::kMinimaxM2;
  if (name == "kimi_k2") return ToolCallParser::kKimiK2;
  return absl::InvalidArgumentError(absl::StrCat(
      "--tool-call-parser: unknown parser '", std::string(name),
      "' (auto, hermes, llama3_json, llama4_json, pythonic, llama4_pythonic, mistral, "
      "phi4_mini_json, deepseek_v3, deepseek_v31, qwen3_coder, glm45, glm4_moe, minimax_m2, "
      "kimi_k2, json)"));
}

const char* ToolCallParserName(ToolCallParser parser) {
  switch (parser) {
    case ToolCallParser::kJson:
      return "json";
    case ToolCallParser::kHermes:
      return "hermes";
    case ToolCallParser::kLlama3Json:
      return "llama3_json";
    case ToolCallParser::kPythonic:
      return "pythonic";
    case ToolCallParser::kMistral:
      return "mistral";
    case ToolCallParser::kPhi4MiniJson:
      return "phi4_mini_json";
    case ToolCallParser::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallParser::kQwen3Coder:
      return "qwen3_coder";
    case ToolCallParser::kGlm45:
      return "glm45";
    case ToolCallParser::kMinimaxM2:
      return "minimax_m2";
    case ToolCallParser::kKimiK2:
      return "kimi_k2";
  }
  return "json";
}

ToolCallParser ToolCallParserOfTemplate(std::string_view source) {
  auto has = [&](std::string_view what) { return source.find(what) != std::string_view::npos; };
  // The tagged formats first: GLM's and Qwen3-Coder's also open calls with <tool_call>.
  if (has("<|tool_calls_section_begin|>")) return ToolCallParser::kKimiK2;
  if (has("<minimax:tool_call>")) return ToolCallParser::kMinimaxM2;
  if (has("<arg_key>")) return ToolCallParser::kGlm45;
  if (has("<function=")) return ToolCallParser::kQwen3Coder;
  if (has(kHermesOpen)) return ToolCallParser::kHermes;
  if (has(kMistralCalls)) return ToolCallParser::kMistral;
  if (has(kDsCallBegin)) return ToolCallParser::kDeepSeekV3;
  if (has("functools")) return ToolCallParser::kPhi4MiniJson;
  if (has(kPythonStart)) return ToolCallParser::kPythonic;
  if (has("<|start_header_id|>") &&
      (has(kPythonTag) || has("\"parameters\"") || has("'parameters'"))) {
    return ToolCallParser::kLlama3Json;
  }
  return ToolCallParser::kJson;
}

ToolCallParse ParseToolCallText(ToolCallParser parser, std::string_view text, bool final,
                                const std::vector<std::string>& tools,
                                const nlohmann::ordered_json* parameters) {
  Ctx c{text, final, tools, {}};
  switch (parser) {
    case ToolCallParser::kHermes:
      return ParseHermes(c);
    case ToolCallParser::kLlama3Json:
      return ParseLlama3Json(c);
    case ToolCallParser::kPythonic:
      return ParsePythonic(c);
    case ToolCallParser::kMistral:
      return ParseMistral(c);
    case ToolCallParser::kPhi4MiniJson:
      return ParsePhi4Mini(c);
    case ToolCallParser::kDeepSeekV3:
      return ParseDeepSeek(c);
    case ToolCallParser::kJson:
      return ParseJson(c);
    case ToolCallParser::kQwen3Coder:
      return ParseTaggedToolCalls(TaggedFormat::kQwen3Coder, text, final, tools, parameters);
    case ToolCallParser::kGlm45:
      return ParseTaggedToolCalls(TaggedFormat::kGlm45, text, final, tools, parameters);
    case ToolCallParser::kMinimaxM2:
      return ParseTaggedToolCalls(TaggedFormat::kMinimaxM2, text, final, tools, parameters);
    case ToolCallParser::kKimiK2:
      return ParseTaggedToolCalls(TaggedFormat::kKimiK2, text, final, tools, parameters);
  }
  return ParseJson(c);
}

}  // namespace tandem
