#include "common/tokenizer/chat_template_lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem::chat_template {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

int LineAt(absl::string_view s, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < s.size(); ++i) line += s[i] == '\n' ? 1 : 0;
  return line;
}

absl::Status Error(absl::string_view src, size_t pos, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template: line ", LineAt(src, pos), ": ", message));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads a Python-style string literal at src[*pos] (the quote); advances past it.
absl::Status ReadString(absl::string_view src, size_t* pos, std::string* out) {
  const char quote = src[*pos];
  size_t i = *pos + 1;
  while (i < src.size() && src[i] != quote) {
    if (src[i] != '\\' || i + 1 >= src.size()) {
      out->push_back(src[i++]);
      continue;
    }
    const char e = src[i + 1];
    i += 2;
    switch (e) {
      case 'n':
        out->push_back('\n');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case '0':
        out->push_back('\0');
        break;
      case '\\':
      case '\'':
      case '"':
        out->push_back(e);
        break;
      case '\n':
        break;
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < digits; ++k) {
          const int h = i + k < src.size() ? HexValue(src[i + k]) : -1;
          if (h < 0) return Error(src, i, "bad escape in a string literal");
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (cp > 0x10ffff) return Error(src, i, "bad escape in a string literal");
        i += digits;
        AppendUtf8(cp, out);
        break;
      }
      default:
        out->push_back('\\');
        out->push_back(e);
    }
  }
  if (i >= src.size()) return Error(src, *pos, "unterminated string literal");
  *pos = i + 1;
  return absl::OkStatus();
}

// Tokenizes a tag's content from src[*pos] up to its closer ("}}" or "%}", optionally preceded
// by "-" or "+") at bracket depth 0. Sets *strip_after for "-", *keep_after for "+".
absl::Status LexTag(absl::string_view src, size_t* pos, char closer, std::vector<Token>* tokens,
                    bool* strip_after, bool* keep_after) {
  int depth = 0;
  size_t i = *pos;
  while (true) {
    while (i < src.size() && IsSpace(src[i])) ++i;
    if (i >= src.size()) return Error(src, *pos, "unterminated tag");
    if (depth == 0) {
      for (char mod : {'\0', '-', '+'}) {
        const size_t at = mod == '\0' ? i : i + 1;
        if (mod != '\0' && src[i] != mod) continue;
        if (at + 1 < src.size() && src[at] == closer && src[at + 1] == '}') {
          *strip_after = mod == '-';
          *keep_after = mod == '+';
          *pos = at + 2;
          return absl::OkStatus();
        }
      }
    }
    const char c = src[i];
    Token t;
    if (IsNameStart(c)) {
      const size_t start = i;
      while (i < src.size() && IsNameChar(src[i])) ++i;
      t.type = Token::Type::kName;
      t.text = std::string(src.substr(start, i - start));
    } else if (c == '0' && i + 2 < src.size() &&
               absl::string_view("xXoObB").find(src[i + 1]) != absl::string_view::npos &&
               std::isxdigit(static_cast<unsigned char>(src[i + 2]))) {  // 0x1f, 0o17, 0b101
      const int base = src[i + 1] == 'x' || src[i + 1] == 'X'   ? 16
                       : src[i + 1] == 'o' || src[i + 1] == 'O' ? 8
                                                                : 2;
      const size_t start = i;
      i += 2;
      std::string digits;
      while (i < src.size() &&
             (std::isxdigit(static_cast<unsigned char>(src[i])) || src[i] == '_')) {
        if (src[i] != '_') digits.push_back(src[i]);
        ++i;
      }
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(digits.c_str(), &end, base);
      if (errno != 0 || end != digits.c_str() + digits.size()) {
        return Error(src, start, "bad integer literal");
      }
      t.type = Token::Type::kInt;
      t.value = Json(static_cast<int64_t>(v));
      t.text = std::string(src.substr(start, i - start));
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      const size_t start = i;
      bool is_float = false;
      // After a ".", digits are an index (`matrix.0.1`), never a float (Jinja's (?<!\.)).
      const bool after_dot =
          !tokens->empty() && tokens->back().type == Token::Type::kOp && tokens->back().text == ".";
      while (i < src.size() && (std::isdigit(static_cast<unsigned char>(src[i])) || src[i] == '_'))
        ++i;
      if (!after_dot && i + 1 < src.size() && src[i] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[i + 1]))) {
        is_float = true;
        ++i;
        while (i < src.size() && std::isdigit(static_cast<unsigned char>(src[i]))) ++i;
      }
      if (!after_dot && i < src.size() && (src[i] == 'e' || src[i] == 'E')) {
        size_t j = i + 1;
        if (j < src.size() && (src[j] == '+' || src[j] == '-')) ++j;
        if (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) {
          is_float = true;
          i = j;
          while (i < src.size() && std::isdigit(static_cast<unsigned char>(src[i]))) ++i;
        }
      }
      std::string digits;
      for (size_t k = start; k < i; ++k) {
        if (src[k] != '_') digits.push_back(src[k]);
      }
      if (is_float) {
        t.type = Token::Type::kFloat;
        t.value = Json(std::strtod(digits.c_str(), nullptr));
      } else {
        if (digits.size() > 18) return Error(src, start, "integer literal too large");
        t.type = Token::Type::kInt;
        t.value = Json(static_cast<int64_t>(std::strtoll(digits.c_str(), nullptr, 10)));
      }
      t.text = digits;
    } else if (c == '\'' || c == '"') {
      t.type = Token::Type::kString;
      if (auto st = ReadString(src, &i, &t.text); !st.ok()) return st;
    } else {
      static constexpr absl::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
      t.type = Token::Type::kOp;
      for (absl::string_view op : kTwo) {
        if (src.substr(i, 2) == op) t.text = std::string(op);
      }
      if (t.text.empty()) {
        if (absl::string_view("+-*/%~()[]{}.,:|<>=").find(c) == absl::string_view::npos) {
          return Error(src, i, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        t.text = std::string(1, c);
      }
      i += t.text.size();
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    }
    tokens->push_back(std::move(t));
  }
}

// Jinja's lexer turns every newline ("\r\n", "\r", "\n") of the source into "\n" and, without
// keep_trailing_newline (Hugging Face's setting), drops one at the very end.
std::string NormalizeNewlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The tag {% endraw %} (with any "-"/"+" and spacing) at or after `from`; npos if none.
size_t FindEndRaw(absl::string_view src, size_t from) {
  for (size_t at = src.find("{%", from); at != absl::string_view::npos;
       at = src.find("{%", at + 1)) {
    size_t i = at + 2;
    if (i < src.size() && (src[i] == '-' || src[i] == '+')) ++i;
    while (i < src.size() && IsSpace(src[i])) ++i;
    if (src.substr(i, 6) != "endraw") continue;
    i += 6;
    while (i < src.size() && IsSpace(src[i])) ++i;
    if (i < src.size() && (src[i] == '-' || src[i] == '+')) ++i;
    if (src.substr(i, 2) == "%}") return at;
  }
  return absl::string_view::npos;
}

bool IsRawTag(const std::vector<Token>& tokens, absl::string_view word) {
  return tokens.size() == 1 && tokens[0].type == Token::Type::kName && tokens[0].text == word;
}

}  // namespace

absl::StatusOr<std::vector<Piece>> LexTemplate(absl::string_view source) {
  const std::string normalized = NormalizeNewlines(source);
  const absl::string_view src = normalized;
  std::vector<Piece> pieces;
  size_t pos = 0;
  bool strip_next = false;  // the previous tag ended with "-"
  bool trim_next = false;   // the previous tag was a block or comment (trim_blocks)
  bool in_raw = false;      // after {% raw %}: text up to {% endraw %}
  while (true) {
    size_t start;
    if (in_raw) {
      start = FindEndRaw(src, pos);
      if (start == absl::string_view::npos) return Error(src, pos, "missing {% endraw %}");
    } else {
      start = src.find('{', pos);
      while (start != absl::string_view::npos && start + 1 < src.size() && src[start + 1] != '{' &&
             src[start + 1] != '%' && src[start + 1] != '#') {
        start = src.find('{', start + 1);
      }
    }
    if (start != absl::string_view::npos && start + 1 >= src.size())
      start = absl::string_view::npos;
    const size_t text_end = start == absl::string_view::npos ? src.size() : start;
    std::string text(src.substr(pos, text_end - pos));
    // Jinja's line_starting: the previous match (a tag's end with what it consumed) ended a line.
    bool line_starting = pos == 0;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && IsSpace(text[k])) ++k;
      line_starting = k > 0 && text[k - 1] == '\n';
      text.erase(0, k);
    } else if (trim_next && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      line_starting = true;
    }
    if (start == absl::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, 0});
      break;
    }
    const char kind = src[start + 1];
    size_t i = start + 2;
    const char mod = i < src.size() && (src[i] == '-' || src[i] == '+') ? src[i] : '\0';
    if (mod != '\0') ++i;
    if (mod == '-') {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (kind != '{' && mod != '+') {
      // lstrip_blocks: whitespace between the start of a line and a block tag goes.
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) && from < text.size()) {
        bool blank = true;
        for (size_t k = from; k < text.size(); ++k) blank &= IsSpace(text[k]);
        if (blank) text.erase(from);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, 0});
    bool strip_after = false, keep_after = false;
    if (kind == '#') {
      size_t end = src.find("#}", i);
      if (end == absl::string_view::npos) return Error(src, start, "unterminated comment");
      strip_after = end > i && src[end - 1] == '-';
      keep_after = end > i && src[end - 1] == '+';
      pos = end + 2;
    } else {
      Piece piece;
      piece.kind = kind == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement;
      piece.line = LineAt(src, start);
      pos = i;
      if (auto st =
              LexTag(src, &pos, kind == '{' ? '}' : '%', &piece.tokens, &strip_after, &keep_after);
          !st.ok()) {
        return st;
      }
      if (piece.tokens.empty()) return Error(src, start, "empty tag");
      // {% raw %} and {% endraw %} only switch the lexer; the text between stays text.
      if (in_raw) {
        in_raw = false;
      } else if (piece.kind == Piece::Kind::kStatement && IsRawTag(piece.tokens, "raw")) {
        in_raw = true;
      } else {
        pieces.push_back(std::move(piece));
      }
    }
    strip_next = strip_after;
    trim_next = kind != '{' && !keep_after;
  }
  return pieces;
}

}  // namespace tandem::chat_template
