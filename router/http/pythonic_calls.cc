#include "router/http/pythonic_calls.h"

#include <algorithm>
#include <cctype>

#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using OrderedJson = nlohmann::ordered_json;

enum class Lit { kOk, kIncomplete, kError };

// A recursive-descent reader of Python literals over a possibly unfinished text.
class LiteralReader {
 public:
  explicit LiteralReader(std::string_view s, size_t pos) : s_(s), pos_(pos) {}
  size_t pos() const { return pos_; }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return s_[pos_]; }

  Lit Value(OrderedJson* out, int depth = 0) {
    if (depth > 64) return Lit::kError;
    SkipSpace();
    if (AtEnd()) return Lit::kIncomplete;
    const char c = Peek();
    if (c == '"' || c == '\'') return String(out);
    if (c == '[' || c == '(') return Sequence(c == '[' ? ']' : ')', out, depth);
    if (c == '{') return Dict(out, depth);
    if (c == '-' || c == '+' || c == '.' || std::isdigit(static_cast<unsigned char>(c))) {
      return Number(out);
    }
    if (std::isalpha(static_cast<unsigned char>(c))) {
      size_t e = pos_;
      while (e < s_.size() && std::isalnum(static_cast<unsigned char>(s_[e]))) ++e;
      const std::string_view word = s_.substr(pos_, e - pos_);
      if (e >= s_.size()) {
        for (std::string_view w : {"True", "False", "None"}) {
          if (w.substr(0, word.size()) == word) return Lit::kIncomplete;
        }
        return Lit::kError;
      }
      pos_ = e;
      if (word == "True")
        *out = true;
      else if (word == "False")
        *out = false;
      else if (word == "None")
        *out = nullptr;
      else
        return Lit::kError;
      return Lit::kOk;
    }
    return Lit::kError;
  }

 private:
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  Lit Hex(size_t digits, uint32_t* cp) {
    if (pos_ + digits > s_.size()) return Lit::kIncomplete;
    *cp = 0;
    for (size_t k = 0; k < digits; ++k) {
      const char h = s_[pos_ + k];
      if (!std::isxdigit(static_cast<unsigned char>(h))) return Lit::kError;
      *cp = *cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : std::tolower(h) - 'a' + 10);
    }
    pos_ += digits;
    return *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff) ? Lit::kError : Lit::kOk;
  }

  Lit String(OrderedJson* out) {
    const char q = Peek();
    const bool triple = s_.substr(pos_, 3) == std::string(3, q);
    pos_ += triple ? 3 : 1;
    std::string text;
    while (true) {
      if (AtEnd()) return Lit::kIncomplete;
      const char c = s_[pos_];
      if (c == q) {
        if (!triple) {
          ++pos_;
          break;
        }
        if (s_.size() - pos_ < 3) return Lit::kIncomplete;
        if (s_.substr(pos_, 3) == std::string(3, q)) {
          pos_ += 3;
          break;
        }
        text.push_back(c);
        ++pos_;
        continue;
      }
      if (c == '\n' && !triple) return Lit::kError;
      if (c != '\\') {
        text.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= s_.size()) return Lit::kIncomplete;
      const char e = s_[pos_ + 1];
      pos_ += 2;
      uint32_t cp = 0;
      switch (e) {
        case 'n':
          text += '\n';
          break;
        case 't':
          text += '\t';
          break;
        case 'r':
          text += '\r';
          break;
        case 'b':
          text += '\b';
          break;
        case 'f':
          text += '\f';
          break;
        case '0':
          text += '\0';
          break;
        case '\\':
        case '\'':
        case '"':
          text += e;
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const Lit h = Hex(e == 'x' ? 2 : e == 'u' ? 4 : 8, &cp);
          if (h != Lit::kOk) return h;
          AppendUtf8(cp, &text);
          break;
        }
        default:
          text += '\\';
          text += e;
      }
    }
    *out = std::move(text);
    return Lit::kOk;
  }

  Lit Number(OrderedJson* out) {
    size_t e = pos_;
    while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '.' ||
                             s_[e] == '-' || s_[e] == '+' || s_[e] == '_')) {
      ++e;
    }
    if (e >= s_.size()) return Lit::kIncomplete;  // more digits may follow
    std::string text(s_.substr(pos_, e - pos_));
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    if (!text.empty() && text[0] == '+') text.erase(0, 1);
    // Python accepts "1." and ".5"; JSON wants "1.0" and "0.5".
    const size_t dot = text.find('.');
    if (dot != std::string::npos) {
      if (dot + 1 == text.size() || !std::isdigit(static_cast<unsigned char>(text[dot + 1]))) {
        text.insert(dot + 1, "0");
      }
      if (dot == 0 || !std::isdigit(static_cast<unsigned char>(text[dot - 1]))) {
        text.insert(dot, "0");
      }
    }
    const OrderedJson v = OrderedJson::parse(text, nullptr, false);
    if (!v.is_number()) return Lit::kError;
    *out = v;
    pos_ = e;
    return Lit::kOk;
  }

  Lit Sequence(char close, OrderedJson* out, int depth) {
    ++pos_;
    *out = OrderedJson::array();
    while (true) {
      SkipSpace();
      if (AtEnd()) return Lit::kIncomplete;
      if (Peek() == close) {
        ++pos_;
        return Lit::kOk;
      }
      OrderedJson item;
      const Lit r = Value(&item, depth + 1);
      if (r != Lit::kOk) return r;
      out->push_back(std::move(item));
      SkipSpace();
      if (AtEnd()) return Lit::kIncomplete;
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != close) {
        return Lit::kError;
      }
    }
  }

  Lit Dict(OrderedJson* out, int depth) {
    ++pos_;
    *out = OrderedJson::object();
    while (true) {
      SkipSpace();
      if (AtEnd()) return Lit::kIncomplete;
      if (Peek() == '}') {
        ++pos_;
        return Lit::kOk;
      }
      OrderedJson key;
      Lit r = Value(&key, depth + 1);
      if (r != Lit::kOk) return r;
      if (!key.is_string()) return Lit::kError;
      SkipSpace();
      if (AtEnd()) return Lit::kIncomplete;
      if (Peek() != ':') return Lit::kError;
      ++pos_;
      OrderedJson value;
      r = Value(&value, depth + 1);
      if (r != Lit::kOk) return r;
      (*out)[key.get<std::string>()] = std::move(value);
      SkipSpace();
      if (AtEnd()) return Lit::kIncomplete;
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != '}') {
        return Lit::kError;
      }
    }
  }

  std::string_view s_;
  size_t pos_;
};

bool IdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

}  // namespace

std::optional<std::string> PythonLiteralToJson(std::string_view text) {
  LiteralReader r(text, 0);
  OrderedJson v;
  if (r.Value(&v) != Lit::kOk) return std::nullopt;
  r.SkipSpace();
  if (!r.AtEnd()) return std::nullopt;
  return v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

CallRegion ParsePythonicCalls(std::string_view s, size_t pos, bool final,
                              const std::vector<std::string>& tools,
                              std::vector<ToolCallPart>* calls, size_t* end) {
  LiteralReader r(s, pos + 1);
  const size_t first_call = calls->size();
  auto incomplete = [&] { return final ? CallRegion::kError : CallRegion::kPartial; };
  while (true) {
    r.SkipSpace();
    if (r.AtEnd())
      return calls->size() == first_call && final ? CallRegion::kNotCalls : incomplete();
    size_t i = r.pos();
    if (!IdentStart(s[i]))
      return calls->size() == first_call ? CallRegion::kNotCalls : CallRegion::kError;
    while (i < s.size() && IdentChar(s[i])) ++i;
    if (i >= s.size()) return incomplete();
    if (s[i] != '(')
      return calls->size() == first_call ? CallRegion::kNotCalls : CallRegion::kError;
    ToolCallPart part;
    part.name = std::string(s.substr(r.pos(), i - r.pos()));
    part.streamable = false;
    if (std::find(tools.begin(), tools.end(), part.name) == tools.end()) return CallRegion::kError;
    calls->push_back(part);
    r = LiteralReader(s, i + 1);
    OrderedJson args = OrderedJson::object();
    while (true) {
      r.SkipSpace();
      if (r.AtEnd()) return incomplete();
      if (r.Peek() == ')') break;
      size_t k = r.pos();
      if (!IdentStart(s[k])) return CallRegion::kError;
      while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
      const std::string key(s.substr(r.pos(), k - r.pos()));
      r = LiteralReader(s, k);
      r.SkipSpace();
      if (r.AtEnd()) return incomplete();
      if (r.Peek() != '=') return CallRegion::kError;
      r = LiteralReader(s, r.pos() + 1);
      OrderedJson value;
      const Lit lit = r.Value(&value);
      if (lit == Lit::kError) return CallRegion::kError;
      if (lit == Lit::kIncomplete) return incomplete();
      args[key] = std::move(value);
      r.SkipSpace();
      if (r.AtEnd()) return incomplete();
      if (r.Peek() == ',') {
        r = LiteralReader(s, r.pos() + 1);
      } else if (r.Peek() != ')') {
        return CallRegion::kError;
      }
    }
    ToolCallPart& done = calls->back();
    done.arguments = args.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
    done.complete = true;
    r = LiteralReader(s, r.pos() + 1);
    r.SkipSpace();
    if (r.AtEnd()) return incomplete();
    if (r.Peek() == ']') {
      *end = r.pos() + 1;
      return CallRegion::kDone;
    }
    if (r.Peek() != ',') return CallRegion::kError;
    r = LiteralReader(s, r.pos() + 1);
  }
}

}  // namespace tandem
