#include "router/http/json_scan.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The end of the string starting at `pos` (its opening quote): one past the closing quote, or
// npos while it is unterminated.
size_t StringEnd(std::string_view s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    } else if (static_cast<unsigned char>(s[i]) < 0x20) {
      return std::string_view::npos - 1;  // a raw control character: not JSON
    }
  }
  return std::string_view::npos;
}

}  // namespace

size_t SkipJsonSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsSpace(s[pos])) ++pos;
  return pos;
}

JsonValueScan ScanJsonValue(std::string_view s, size_t pos, bool final) {
  JsonValueScan r;
  r.end = s.size();
  if (pos >= s.size()) return r;
  const char c = s[pos];
  if (c == '"') {
    const size_t end = StringEnd(s, pos);
    if (end == std::string_view::npos - 1) {
      r.error = true;
    } else if (end != std::string_view::npos) {
      r.end = end;
      r.complete = true;
    }
    return r;
  }
  if (c == '{' || c == '[') {
    std::vector<char> stack;
    for (size_t i = pos; i < s.size(); ++i) {
      const char d = s[i];
      if (d == '"') {
        const size_t end = StringEnd(s, i);
        if (end == std::string_view::npos - 1) {
          r.error = true;
          return r;
        }
        if (end == std::string_view::npos) return r;
        i = end - 1;
      } else if (d == '{' || d == '[') {
        if (stack.size() >= 256) {
          r.error = true;
          return r;
        }
        stack.push_back(d == '{' ? '}' : ']');
      } else if (d == '}' || d == ']') {
        if (stack.empty() || stack.back() != d) {
          r.error = true;
          return r;
        }
        stack.pop_back();
        if (stack.empty()) {
          r.end = i + 1;
          r.complete = true;
          return r;
        }
      }
    }
    return r;
  }
  if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
    size_t i = pos;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '-' ||
                            s[i] == '+' || s[i] == '.')) {
      ++i;
    }
    r.end = i;
    r.complete = i < s.size() || final;
    return r;
  }
  r.error = true;
  return r;
}

JsonCallScan ScanJsonCall(std::string_view s, size_t pos, bool final) {
  JsonCallScan r;
  if (pos >= s.size() || s[pos] != '{') {
    r.error = pos < s.size();
    return r;
  }
  size_t i = pos + 1;
  while (true) {
    i = SkipJsonSpace(s, i);
    if (i >= s.size()) return r;
    if (s[i] == '}') {
      r.end = i + 1;
      r.complete = true;
      return r;
    }
    if (s[i] != '"') {
      r.error = true;
      return r;
    }
    const size_t key_end = StringEnd(s, i);
    if (key_end == std::string_view::npos) return r;
    if (key_end == std::string_view::npos - 1) {
      r.error = true;
      return r;
    }
    const nlohmann::json key = nlohmann::json::parse(s.substr(i, key_end - i), nullptr, false);
    if (!key.is_string()) {
      r.error = true;
      return r;
    }
    const std::string k = key.get<std::string>();
    i = SkipJsonSpace(s, key_end);
    if (i >= s.size()) return r;
    if (s[i] != ':') {
      r.error = true;
      return r;
    }
    i = SkipJsonSpace(s, i + 1);
    if (i >= s.size()) return r;
    const bool is_args = k == "arguments" || k == "parameters";
    if (is_args) {
      r.has_args = true;
      r.args_begin = i;
    }
    const JsonValueScan v = ScanJsonValue(s, i, final);
    if (v.error) {
      r.error = true;
      return r;
    }
    if (is_args) {
      r.args_end = v.end;
      r.args_complete = v.complete;
    }
    if (!v.complete) return r;
    if (k == "name") {
      const nlohmann::json name = nlohmann::json::parse(s.substr(i, v.end - i), nullptr, false);
      if (!name.is_string()) {
        r.error = true;
        return r;
      }
      r.name = name.get<std::string>();
      r.has_name = true;
    }
    i = SkipJsonSpace(s, v.end);
    if (i >= s.size()) return r;
    if (s[i] == ',') {
      ++i;
    } else if (s[i] != '}') {
      r.error = true;
      return r;
    }
  }
}

size_t PartialMarkerSuffix(std::string_view text, std::string_view marker) {
  const size_t most = std::min(text.size(), marker.size() - 1);
  for (size_t n = most; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace tandem
