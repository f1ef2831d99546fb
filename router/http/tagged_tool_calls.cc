#include "router/http/tagged_tool_calls.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "router/http/json_scan.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// Where a call (or the whole region of calls) stands after reading as far as the text goes.
enum class TagStep { kDone, kPartial, kError };

struct TagMarkers {
  std::string_view open;       // starts a region of calls
  std::string_view close;      // ends it (optional at the very end of the output)
  std::string_view call_open;  // starts a call within the region (empty: the region is one call)
};

TagMarkers TagMarkersOf(TaggedFormat f) {
  switch (f) {
    case TaggedFormat::kQwen3Coder:
      return {"<tool_call>", "</tool_call>", "<function="};
    case TaggedFormat::kGlm45:
      return {"<tool_call>", "</tool_call>", ""};
    case TaggedFormat::kMinimaxM2:
      return {"<minimax:tool_call>", "</minimax:tool_call>", "<invoke name="};
    case TaggedFormat::kKimiK2:
      return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>"};
  }
  return {};
}

bool IsTagSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string TagTrimmed(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size())));
}

// MiniMax writes names quoted: name="get_weather".
std::string TagUnquoted(std::string_view s) {
  std::string t = TagTrimmed(s);
  if (t.size() >= 2 && (t[0] == '"' || t[0] == '\'') && t.back() == t[0]) {
    t = t.substr(1, t.size() - 2);
  }
  return t;
}

// One parse: a cursor over the text and the calls found.
struct TaggedParse {
  std::string_view s;
  bool final;
  const std::vector<std::string>& tools;
  const Json* parameters;
  TaggedFormat format;
  size_t pos = 0;
  ToolCallParse out;

  bool At(std::string_view m) const { return s.substr(pos, m.size()) == m; }
  // The rest of the text is a proper prefix of `m`: it may still become `m`.
  bool Forming(std::string_view m) const {
    return !final && s.size() - pos < m.size() && m.substr(0, s.size() - pos) == s.substr(pos);
  }
  void SkipSpace() {
    while (pos < s.size() && IsTagSpace(s[pos])) ++pos;
  }
  // Past `m` when it is at the cursor.
  TagStep Expect(std::string_view m) {
    if (At(m)) {
      pos += m.size();
      return TagStep::kDone;
    }
    return Forming(m) || (!final && pos >= s.size()) ? TagStep::kPartial : TagStep::kError;
  }
  // The text up to `m`, the cursor past it.
  TagStep Until(std::string_view m, std::string* text) {
    const size_t at = s.find(m, pos);
    if (at == std::string_view::npos) return final ? TagStep::kError : TagStep::kPartial;
    *text = std::string(s.substr(pos, at - pos));
    pos = at + m.size();
    return TagStep::kDone;
  }

  bool Known(const std::string& name) const {
    return std::find(tools.begin(), tools.end(), name) != tools.end();
  }
  const Json* ParamSchema(const std::string& tool, const std::string& param) const {
    if (parameters == nullptr || !parameters->is_object()) return nullptr;
    auto t = parameters->find(tool);
    if (t == parameters->end() || !t->is_object()) return nullptr;
    auto props = t->find("properties");
    if (props == t->end() || !props->is_object()) return nullptr;
    auto p = props->find(param);
    return p == props->end() ? nullptr : &*p;
  }
  void SetArgument(const ToolCallPart& part, Json* args, const std::string& key,
                   const std::string& value) {
    (*args)[key] = TypedArgumentValue(value, ParamSchema(part.name, key),
                                      /*untyped_as_json=*/format == TaggedFormat::kGlm45);
  }

  // The call after its call_open marker: its name, then its parameters or arguments.
  TagStep Call(ToolCallPart* part) {
    Json args = Json::object();
    TagStep st = TagStep::kDone;
    switch (format) {
      case TaggedFormat::kQwen3Coder:
        st = Qwen3CoderCall(part, &args);
        break;
      case TaggedFormat::kGlm45:
        st = Glm45Call(part, &args);
        break;
      case TaggedFormat::kMinimaxM2:
        st = MinimaxCall(part, &args);
        break;
      case TaggedFormat::kKimiK2:
        return KimiCall(part);
    }
    if (st == TagStep::kDone) {
      // Invalid UTF-8 in a value (a model can write any bytes) becomes U+FFFD, never a throw.
      part->arguments = args.dump(-1, ' ', false, Json::error_handler_t::replace);
      part->complete = true;
    }
    return st;
  }

  // The name, checked once complete.
  TagStep Name(std::string name, ToolCallPart* part) {
    if (!Known(name)) return TagStep::kError;
    part->name = std::move(name);
    return TagStep::kDone;
  }

  // NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>; a parameter also ends at the next
  // one or at </function>, and (at the end of the output) the call at the end of the text.
  TagStep Qwen3CoderCall(ToolCallPart* part, Json* args) {
    std::string name;
    if (TagStep st = Until(">", &name); st != TagStep::kDone) return st;
    if (TagStep st = Name(std::move(name), part); st != TagStep::kDone) return st;
    while (true) {
      SkipSpace();
      if (At("</function>")) {
        pos += 11;
        return TagStep::kDone;
      }
      if (final && pos >= s.size()) return TagStep::kDone;
      if (!At("<parameter=")) {
        return Forming("</function>") || Forming("<parameter=") || pos >= s.size()
                   ? TagStep::kPartial
                   : TagStep::kError;
      }
      pos += 11;
      std::string key;
      if (TagStep st = Until(">", &key); st != TagStep::kDone) return st;
      size_t end = s.size();
      for (std::string_view m : {"</parameter>", "<parameter=", "</function>"}) {
        end = std::min(end, s.find(m, pos));
      }
      if (end == s.size() && !final) return TagStep::kPartial;
      std::string value(s.substr(pos, end - pos));
      pos = end;
      if (At("</parameter>")) pos += 12;
      if (!value.empty() && value.front() == '\n') value.erase(0, 1);
      if (!value.empty() && value.back() == '\n') value.pop_back();
      SetArgument(*part, args, key, value);
    }
  }

  // NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...</tool_call> (the region's
  // close ends the call).
  TagStep Glm45Call(ToolCallPart* part, Json* args) {
    size_t end = s.size();
    for (std::string_view m : {"\n", "<arg_key>", "</tool_call>"})
      end = std::min(end, s.find(m, pos));
    if (end == s.size()) return final ? TagStep::kError : TagStep::kPartial;
    std::string name = TagTrimmed(s.substr(pos, end - pos));
    pos = end;
    if (TagStep st = Name(std::move(name), part); st != TagStep::kDone) return st;
    while (true) {
      SkipSpace();
      if (At("</tool_call>") || (final && pos >= s.size())) return TagStep::kDone;
      if (TagStep st = Expect("<arg_key>"); st != TagStep::kDone) {
        return st == TagStep::kError && Forming("</tool_call>") ? TagStep::kPartial : st;
      }
      std::string key, value;
      if (TagStep st = Until("</arg_key>", &key); st != TagStep::kDone) return st;
      SkipSpace();
      if (TagStep st = Expect("<arg_value>"); st != TagStep::kDone) return st;
      if (TagStep st = Until("</arg_value>", &value); st != TagStep::kDone) return st;
      SetArgument(*part, args, TagTrimmed(key), TagTrimmed(value));
    }
  }

  // "NAME">\n<parameter name="KEY">VALUE</parameter>...</invoke>
  TagStep MinimaxCall(ToolCallPart* part, Json* args) {
    std::string name;
    if (TagStep st = Until(">", &name); st != TagStep::kDone) return st;
    if (TagStep st = Name(TagUnquoted(name), part); st != TagStep::kDone) return st;
    while (true) {
      SkipSpace();
      if (At("</invoke>")) {
        pos += 9;
        return TagStep::kDone;
      }
      if (TagStep st = Expect("<parameter name="); st != TagStep::kDone) {
        return st == TagStep::kError && Forming("</invoke>") ? TagStep::kPartial : st;
      }
      std::string key, value;
      if (TagStep st = Until(">", &key); st != TagStep::kDone) return st;
      if (TagStep st = Until("</parameter>", &value); st != TagStep::kDone) return st;
      SetArgument(*part, args, TagUnquoted(key), TagTrimmed(value));
    }
  }

  // functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>; the id is the call's.
  TagStep KimiCall(ToolCallPart* part) {
    std::string id;
    if (TagStep st = Until("<|tool_call_argument_begin|>", &id); st != TagStep::kDone) return st;
    id = TagTrimmed(id);
    const size_t colon = id.rfind(':');
    if (colon == std::string::npos || colon + 1 == id.size() ||
        !std::all_of(id.begin() + colon + 1, id.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      return TagStep::kError;
    }
    const std::string qualified = id.substr(0, colon);
    const size_t dot = qualified.rfind('.');
    if (TagStep st = Name(dot == std::string::npos ? qualified : qualified.substr(dot + 1), part);
        st != TagStep::kDone) {
      return st;
    }
    part->id = std::move(id);
    SkipSpace();
    if (pos >= s.size()) return final ? TagStep::kError : TagStep::kPartial;
    if (s[pos] != '{') return TagStep::kError;
    const JsonValueScan v = ScanJsonValue(s, pos, final);
    if (v.error) return TagStep::kError;
    part->arguments = std::string(s.substr(pos, v.end - pos));
    if (!v.complete) return TagStep::kPartial;
    if (!Json::parse(part->arguments, nullptr, false).is_object()) return TagStep::kError;
    pos = v.end;
    SkipSpace();
    if (TagStep st = Expect("<|tool_call_end|>"); st != TagStep::kDone) return st;
    part->complete = true;
    return TagStep::kDone;
  }

  // Regions of calls from the cursor, at a region's open marker (`wrapped`), or at a call's
  // (Qwen3-Coder calls written without the wrapper: each call is a region of its own).
  TagStep Regions(const TagMarkers& m, bool wrapped) {
    while (true) {
      if (wrapped) pos += m.open.size();
      while (true) {  // the calls of one region
        SkipSpace();
        if (wrapped && At(m.close)) {
          pos += m.close.size();
          break;
        }
        if (!m.call_open.empty()) {
          if (wrapped && pos >= s.size() && final) return TagStep::kDone;  // the close is optional
          if (TagStep st = Expect(m.call_open); st != TagStep::kDone) {
            return st == TagStep::kError && wrapped && Forming(m.close) ? TagStep::kPartial : st;
          }
        }
        ToolCallPart part;
        part.streamable = format == TaggedFormat::kKimiK2;
        const TagStep st = Call(&part);
        if (st == TagStep::kError) return st;
        if (!part.name.empty() || st == TagStep::kDone) out.calls.push_back(std::move(part));
        if (st == TagStep::kPartial) return st;
        if (m.call_open.empty()) {  // the region is one call, ended by the close marker
          SkipSpace();
          if (At(m.close)) pos += m.close.size();
          break;
        }
        if (!wrapped) break;
      }
      SkipSpace();
      const std::string_view next = wrapped ? m.open : m.call_open;
      if (At(next)) continue;
      return Forming(next) ? TagStep::kPartial : TagStep::kDone;
    }
  }
};

// Python's int() of a string: whitespace around, a sign, digits with single underscores.
std::optional<int64_t> TagPythonInt(std::string_view text) {
  std::string t;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '_' && i > 0 && i + 1 < text.size() && absl::ascii_isdigit(text[i - 1]) &&
        absl::ascii_isdigit(text[i + 1])) {
      continue;
    }
    t.push_back(text[i]);
  }
  int64_t v;
  if (!absl::SimpleAtoi(t, &v)) return std::nullopt;
  return v;
}

// JSON text, else a Python literal (True, None, single quotes), else the text as a string.
Json JsonOrPythonLiteral(const std::string& text) {
  Json v = Json::parse(text, nullptr, false);
  if (!v.is_discarded()) return v;
  if (std::optional<std::string> literal = PythonLiteralToJson(text)) {
    v = Json::parse(*literal, nullptr, false);
    if (!v.is_discarded()) return v;
  }
  return Json(text);
}

}  // namespace

Json TypedArgumentValue(const std::string& text, const Json* schema, bool untyped_as_json) {
  std::string type;
  const Json* t = schema != nullptr && schema->is_object() && schema->contains("type")
                      ? &(*schema)["type"]
                      : nullptr;
  if (t != nullptr && t->is_array()) {  // ["integer", "null"]: the first type but null
    for (const Json& e : *t) {
      if (e.is_string() && e.get<std::string>() != "null") {
        type = e.get<std::string>();
        break;
      }
    }
  } else if (t != nullptr && t->is_string()) {
    type = t->get<std::string>();
  }
  type = absl::AsciiStrToLower(type);
  if (type.empty()) return untyped_as_json ? JsonOrPythonLiteral(text) : Json(text);
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum") {
    return Json(text);
  }
  const std::string lower = absl::AsciiStrToLower(TagTrimmed(text));
  if (lower == "null") return Json();
  auto starts = [&](std::string_view p) { return type.rfind(p, 0) == 0; };
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    if (std::optional<int64_t> v = TagPythonInt(text)) return Json(*v);
    return Json(text);
  }
  if (starts("num") || starts("float")) {
    double d;
    if (!absl::SimpleAtod(TagTrimmed(text), &d) || !std::isfinite(d)) return Json(text);
    if (d == std::floor(d) && std::fabs(d) < 9.0e15) return Json(static_cast<int64_t>(d));
    return Json(d);
  }
  if (type == "boolean" || type == "bool" || type == "binary") {
    if (lower == "true" || lower == "1") return Json(true);
    if (lower == "false" || lower == "0") return Json(false);
    return Json(text);
  }
  return JsonOrPythonLiteral(text);  // object, array and anything else
}

ToolCallParse ParseTaggedToolCalls(TaggedFormat format, std::string_view text, bool final,
                                   const std::vector<std::string>& tools, const Json* parameters) {
  const TagMarkers m = TagMarkersOf(format);
  TaggedParse p{text, final, tools, parameters, format, 0, {}};
  size_t start = text.find(m.open);
  bool wrapped = true;
  if (format == TaggedFormat::kQwen3Coder) {  // calls may come without the <tool_call> wrapper
    const size_t bare = text.find(m.call_open);
    if (bare < start) {
      start = bare;
      wrapped = false;
    }
  }
  if (start == std::string_view::npos) {
    size_t held = final ? 0 : PartialMarkerSuffix(text, m.open);
    if (format == TaggedFormat::kQwen3Coder && !final) {
      held = std::max(held, PartialMarkerSuffix(text, m.call_open));
    }
    p.out.content = std::string(text.substr(0, text.size() - held));
    return std::move(p.out);
  }
  p.out.content = std::string(text.substr(0, start));
  p.pos = start;
  const TagStep st = p.Regions(m, wrapped);
  if (st == TagStep::kDone) {
    if (final) p.out.trailing = std::string(text.substr(std::min(p.pos, text.size())));
    return std::move(p.out);
  }
  if (final) {  // a call that never completed, or one that does not parse: the text is content
    ToolCallParse malformed;
    malformed.content = std::string(text);
    malformed.malformed = true;
    return malformed;
  }
  // While streaming an error keeps the complete calls found so far and waits for the end.
  if (st == TagStep::kError) {
    while (!p.out.calls.empty() && !p.out.calls.back().complete) p.out.calls.pop_back();
  }
  return std::move(p.out);
}

}  // namespace tandem
