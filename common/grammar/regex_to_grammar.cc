#include "common/grammar/regex_to_grammar.h"

#include <cctype>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

class RegexParser {
 public:
  RegexParser(std::string_view re, bool json_string) : re_(re), json_(json_string) {}

  absl::StatusOr<std::string> Parse() {
    if (Peek() == '^') ++pos_;
    auto expr = Alternation(0);
    if (!expr.ok()) return expr;
    if (pos_ < re_.size()) return Error("unexpected ')'");
    return *expr;
  }

 private:
  char Peek() const { return pos_ < re_.size() ? re_[pos_] : '\0'; }
  bool AtEnd() const { return pos_ >= re_.size(); }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: offset ", pos_, ": ", std::string(what)));
  }

  absl::StatusOr<std::string> Alternation(int depth) {
    if (depth > 100) return Error("groups nested too deeply");
    std::vector<std::string> alts;
    while (true) {
      auto seq = Sequence(depth);
      if (!seq.ok()) return seq;
      alts.push_back(*seq);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return absl::StrCat("(", alts[0], ")");
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) absl::StrAppend(&out, i ? " | " : "", alts[i]);
    return absl::StrCat(out, ")");
  }

  absl::StatusOr<std::string> Sequence(int depth) {
    std::string out = "\"\"";
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == re_.size()) {
        ++pos_;
        break;
      }
      auto atom = Atom(depth);
      if (!atom.ok()) return atom;
      auto quantified = Quantifier(*atom);
      if (!quantified.ok()) return quantified;
      absl::StrAppend(&out, " ", *quantified);
    }
    return out;
  }

  absl::StatusOr<std::string> Quantifier(std::string atom) {
    while (!AtEnd()) {
      char c = Peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        atom = absl::StrCat("(", atom, ")", std::string(1, c));
      } else if (c == '{' && pos_ + 1 < re_.size() &&
                 std::isdigit(static_cast<unsigned char>(re_[pos_ + 1]))) {
        size_t end = re_.find('}', pos_);
        if (end == std::string_view::npos) return Error("unterminated {m,n}");
        std::string bounds(re_.substr(pos_, end - pos_ + 1));
        for (char b : bounds.substr(1, bounds.size() - 2)) {
          if (!std::isdigit(static_cast<unsigned char>(b)) && b != ',') return Error("bad {m,n}");
        }
        pos_ = end + 1;
        atom = absl::StrCat("(", atom, ")", bounds);
      } else {
        break;
      }
      if (Peek() == '?' || Peek() == '+') ++pos_;  // lazy / possessive: same language
    }
    return atom;
  }

  absl::StatusOr<std::string> Atom(int depth) {
    char c = Peek();
    if (c == '(') {
      ++pos_;
      if (Peek() == '?') {
        if (re_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (re_.substr(pos_, 2) == "?P" || re_.substr(pos_, 2) == "?<") {
          // Named group: (?P<name>...) or (?<name>...), but not lookbehind (?<= (?<!.
          if (re_.substr(pos_, 3) == "?<=" || re_.substr(pos_, 3) == "?<!") {
            return Error("lookbehind is not supported");
          }
          size_t close = re_.find('>', pos_);
          if (close == std::string_view::npos) return Error("bad group name");
          pos_ = close + 1;
        } else {
          return Error("lookaround and inline flags are not supported");
        }
      }
      auto inner = Alternation(depth + 1);
      if (!inner.ok()) return inner;
      if (Peek() != ')') return Error("missing ')'");
      ++pos_;
      return *inner;
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      return ClassExpr({{'\n', '\n'}}, /*negated=*/true);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("nothing to repeat");
    if (c == '^' || c == '$') return Error("anchors are only supported at the ends");
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error("dangling backslash");
      char e = re_[pos_];
      Ranges r;
      bool neg = false;
      if (ShorthandClass(e, &r, &neg)) {
        ++pos_;
        return ClassExpr(r, neg);
      }
      if (std::isdigit(static_cast<unsigned char>(e)) && e != '0')
        return Error("backreferences are not supported");
      if (e == 'b' || e == 'B' || e == 'A' || e == 'z' || e == 'Z')
        return Error("assertions are not supported");
      auto cp = Escape();
      if (!cp.ok()) return cp.status();
      return Literal(*cp);
    }
    auto cp = Utf8();
    if (!cp.ok()) return cp.status();
    return Literal(*cp);
  }

  static bool ShorthandClass(char e, Ranges* r, bool* neg) {
    switch (e) {
      case 'd':
      case 'D':
        *r = {{'0', '9'}};
        *neg = e == 'D';
        return true;
      case 'w':
      case 'W':
        *r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        *neg = e == 'W';
        return true;
      case 's':
      case 'S':
        *r = {{'\t', '\r'}, {' ', ' '}};
        *neg = e == 'S';
        return true;
      default:
        return false;
    }
  }

  // After the backslash: one escaped code point.
  absl::StatusOr<uint32_t> Escape() {
    char e = re_[pos_++];
    switch (e) {
      case 'n':
        return uint32_t{'\n'};
      case 't':
        return uint32_t{'\t'};
      case 'r':
        return uint32_t{'\r'};
      case 'f':
        return uint32_t{'\f'};
      case 'v':
        return uint32_t{'\v'};
      case '0':
        return uint32_t{0};
      case 'x':
      case 'u': {
        int n = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek())))
            return Error("bad hex escape");
          char h = re_[pos_++];
          v = v * 16 +
              (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
        }
        return v;
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(e))) {
          pos_--;
          return Error(absl::StrCat("unsupported escape \\", std::string(1, e)));
        }
        return static_cast<uint32_t>(static_cast<unsigned char>(e));
    }
  }

  absl::StatusOr<uint32_t> Utf8() {
    unsigned char c = static_cast<unsigned char>(re_[pos_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > re_.size()) return Error("invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) v = (v << 6) | (static_cast<unsigned char>(re_[pos_ + i]) & 0x3F);
    pos_ += n;
    return v;
  }

  absl::StatusOr<std::string> Class() {
    ++pos_;  // [
    bool neg = false;
    if (Peek() == '^') {
      neg = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      uint32_t lo;
      if (Peek() == '\\') {
        ++pos_;
        if (AtEnd()) return Error("dangling backslash");
        Ranges r;
        bool sneg = false;
        if (ShorthandClass(re_[pos_], &r, &sneg)) {
          ++pos_;
          if (sneg) return Error("negated shorthand inside a class is not supported");
          ranges.insert(ranges.end(), r.begin(), r.end());
          continue;
        }
        auto e = Escape();
        if (!e.ok()) return e.status();
        lo = *e;
      } else {
        if (re_.substr(pos_, 2) == "[:") return Error("POSIX classes are not supported");
        auto u = Utf8();
        if (!u.ok()) return u.status();
        lo = *u;
      }
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        if (Peek() == '\\') {
          ++pos_;
          if (AtEnd()) return Error("dangling backslash");
          auto e = Escape();
          if (!e.ok()) return e.status();
          hi = *e;
        } else {
          auto u = Utf8();
          if (!u.ok()) return u.status();
          hi = *u;
        }
        if (hi < lo) return Error("class range out of order");
      }
      ranges.push_back({lo, hi});
    }
    return ClassExpr(ranges, neg);
  }

  // JSON string content: `"`, `\` and control characters are produced by their escapes.
  std::string Literal(uint32_t cp) const {
    if (json_) {
      if (cp == '"') return "\"\\\\\\\"\"";   // the two bytes \"
      if (cp == '\\') return "\"\\\\\\\\\"";  // the two bytes \\ .
      if (cp < 0x20) return absl::StrCat("\"\\\\u", absl::StrFormat("%04x", cp), "\"");
    }
    return absl::StrCat("\"", EscapeCodePoint(cp), "\"");
  }

  std::string ClassExpr(Ranges ranges, bool neg) const {
    // Normalise to the positive set of code points.
    std::sort(ranges.begin(), ranges.end());
    Ranges pos;
    if (neg) {
      uint32_t next = 0;
      for (auto [lo, hi] : ranges) {
        if (lo > next) pos.push_back({next, lo - 1});
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) pos.push_back({next, 0x10FFFF});
    } else {
      pos = ranges;
    }
    std::vector<std::string> extra;
    if (json_) {
      // Remove the characters that need escapes; add their escaped forms when they were in.
      Ranges plain;
      for (auto [lo, hi] : pos) {
        uint32_t a = lo;
        // Split around [0, 0x1F], '"', '\'.
        std::vector<std::pair<uint32_t, uint32_t>> holes = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        for (auto [hl, hh] : holes) {
          if (a > hi) break;
          if (hh < a || hl > hi) continue;
          for (uint32_t s = std::max(hl, a); s <= std::min(hh, hi); ++s)
            extra.push_back(Literal(s));
          if (hl > a) plain.push_back({a, hl - 1});
          a = hh + 1;
        }
        if (a <= hi) plain.push_back({a, hi});
      }
      pos = plain;
    }
    std::string cls;
    if (!pos.empty()) {
      cls = "[";
      for (auto [lo, hi] : pos) {
        absl::StrAppend(&cls, EscapeCodePoint(lo));
        if (hi > lo) absl::StrAppend(&cls, "-", EscapeCodePoint(hi));
      }
      absl::StrAppend(&cls, "]");
    }
    if (extra.empty()) return cls.empty() ? "[^\\x00-\\U0010FFFF]" : cls;
    std::string out = "(";
    if (!cls.empty()) absl::StrAppend(&out, cls, " | ");
    for (size_t i = 0; i < extra.size(); ++i) absl::StrAppend(&out, i ? " | " : "", extra[i]);
    return absl::StrCat(out, ")");
  }

  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

std::string EscapeCodePoint(uint32_t cp) {
  if (cp >= 0x20 && cp < 0x7F && cp != '"' && cp != '\\' && cp != ']' && cp != '[' && cp != '-' &&
      cp != '^') {
    return std::string(1, static_cast<char>(cp));
  }
  if (cp <= 0xFFFF) return absl::StrFormat("\\u%04X", cp);
  return absl::StrFormat("\\U%08X", cp);
}

std::string GrammarLiteral(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x80) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02X", c));
    } else {
      out.push_back(static_cast<char>(c));  // UTF-8 passes through
    }
  }
  out.push_back('"');
  return out;
}

absl::StatusOr<std::string> RegexToGrammarExpr(std::string_view regex, bool json_string) {
  return RegexParser(regex, json_string).Parse();
}

}  // namespace tandem::grammar
