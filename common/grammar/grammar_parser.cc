#include "common/grammar/grammar_parser.h"

#include <cctype>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace tandem::grammar {
namespace {

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits, CompileBudget* budget)
      : text_(text), b_(limits), budget_(budget) {
    b_.set_budget(budget);
  }

  absl::StatusOr<Grammar> Parse() {
    SkipSpace();
    if (AtEnd()) return Error("empty grammar");
    while (!AtEnd()) {
      std::string name;
      if (!Name(&name)) return Error("expected a rule name");
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error("expected '::=' after the rule name");
      pos_ += 3;
      auto rule = b_.Rule(name);
      if (!rule.ok()) return rule.status();
      if (!defined_.insert(name).second)
        return Error(absl::StrCat("rule '", name, "' defined twice"));
      if (auto st = Alternatives(*rule, 0); !st.ok()) return st;
      SkipSpace();
    }
    auto root = b_.Rule("root");
    if (!root.ok()) return root.status();
    if (!defined_.contains("root")) return Error("no rule named 'root'");
    return b_.Finish(*root);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  absl::Status Error(std::string_view what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: line ", line, " column ", col, ": ", std::string(what)));
  }

  void SkipSpace() {
    while (!AtEnd()) {
      char c = Peek();
      if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool NameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  }

  bool Name(std::string* out) {
    size_t start = pos_;
    while (!AtEnd() && NameChar(Peek()) && !(Peek() == '.' && pos_ == start)) ++pos_;
    *out = std::string(text_.substr(start, pos_ - start));
    return !out->empty();
  }

  // True when a new rule starts here: name followed by '::='.
  bool AtRuleStart() {
    size_t save = pos_;
    std::string name;
    bool yes = false;
    if (Name(&name)) {
      SkipSpace();
      yes = text_.substr(pos_, 3) == "::=";
    }
    pos_ = save;
    return yes;
  }

  // Parses alternatives and adds each as a production of `rule`.
  absl::Status Alternatives(int32_t rule, int depth) {
    if (depth > b_.limits().max_depth) return Error("groups nested too deeply");
    while (true) {
      std::vector<int32_t> seq;
      if (auto st = Sequence(&seq, depth); !st.ok()) return st;
      if (auto st = b_.AddProduction(rule, seq); !st.ok()) return st;
      SkipSpace();
      if (Peek() != '|') return absl::OkStatus();
      ++pos_;
    }
  }

  absl::Status Sequence(std::vector<int32_t>* seq, int depth) {
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')') return absl::OkStatus();
      if (AtRuleStart()) return absl::OkStatus();
      if (budget_ != nullptr) {
        if (auto st = budget_->Check(); !st.ok()) return st;
      }
      std::vector<int32_t> item;
      if (auto st = Primary(&item, depth); !st.ok()) return st;
      if (auto st = Postfix(&item); !st.ok()) return st;
      seq->insert(seq->end(), item.begin(), item.end());
    }
  }

  absl::Status Primary(std::vector<int32_t>* out, int depth) {
    char c = Peek();
    if (c == '"') {
      ++pos_;
      std::string lit;
      while (true) {
        if (AtEnd()) return Error("unterminated string literal");
        char d = Peek();
        if (d == '"') {
          ++pos_;
          break;
        }
        uint32_t cp;
        if (auto st = Char(&cp); !st.ok()) return st;
        unicode::AppendUtf8(static_cast<char32_t>(cp), &lit);
      }
      *out = b_.Literal(lit);
      return absl::OkStatus();
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (Peek() == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      while (true) {
        if (AtEnd()) return Error("unterminated character class");
        if (Peek() == ']') {
          ++pos_;
          break;
        }
        uint32_t lo, hi;
        if (auto st = Char(&lo); !st.ok()) return st;
        hi = lo;
        if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
          ++pos_;
          if (auto st = Char(&hi); !st.ok()) return st;
          if (hi < lo) return Error("character range out of order");
        }
        ranges.push_back({lo, hi});
      }
      auto sym = b_.CodePointClass(std::move(ranges), negated);
      if (!sym.ok()) return sym.status();
      *out = {*sym};
      return absl::OkStatus();
    }
    if (c == '.') {
      ++pos_;
      auto sym = b_.CodePointClass({}, /*negated=*/true);
      if (!sym.ok()) return sym.status();
      *out = {*sym};
      return absl::OkStatus();
    }
    if (c == '(') {
      ++pos_;
      auto rule = b_.NewRule("group");
      if (!rule.ok()) return rule.status();
      if (auto st = Alternatives(*rule, depth + 1); !st.ok()) return st;
      SkipSpace();
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      *out = {*rule};
      return absl::OkStatus();
    }
    std::string name;
    if (Name(&name)) {
      auto rule = b_.Rule(name);
      if (!rule.ok()) return rule.status();
      *out = {*rule};
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // Wraps `item` in a helper rule for *, +, ?, {m}, {m,}, {m,n}.
  absl::Status Postfix(std::vector<int32_t>* item) {
    while (!AtEnd()) {
      char c = Peek();
      int64_t lo = 0, hi = 0;  // hi -1: unbounded
      if (c == '*') {
        lo = 0, hi = -1;
        ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1;
        ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        if (auto st = Bounds(&lo, &hi); !st.ok()) return st;
      } else {
        return absl::OkStatus();
      }
      auto rep = Repeat(*item, lo, hi);
      if (!rep.ok()) return rep.status();
      *item = {*rep};
    }
    return absl::OkStatus();
  }

  absl::Status Bounds(int64_t* lo, int64_t* hi) {
    auto number = [&](int64_t* v) {
      size_t start = pos_;
      *v = 0;
      while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) {
        *v = *v * 10 + (Peek() - '0');
        if (*v > b_.limits().max_repeat) return false;
        ++pos_;
      }
      return pos_ > start;
    };
    SkipSpace();
    if (!number(lo))
      return Error(absl::StrCat("expected a repetition count <= ", b_.limits().max_repeat));
    SkipSpace();
    *hi = *lo;
    if (Peek() == ',') {
      ++pos_;
      SkipSpace();
      *hi = -1;
      if (Peek() != '}' && !number(hi)) {
        return Error(absl::StrCat("expected a repetition bound <= ", b_.limits().max_repeat));
      }
      SkipSpace();
    }
    if (Peek() != '}') return Error("expected '}'");
    ++pos_;
    if (*hi >= 0 && *hi < *lo) return Error("repetition bounds out of order");
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Repeat(const std::vector<int32_t>& item, int64_t lo, int64_t hi) {
    auto rule = b_.NewRule("rep");
    if (!rule.ok()) return rule;
    std::vector<int32_t> prefix;
    for (int64_t i = 0; i < lo; ++i) {
      if (budget_ != nullptr) {
        if (auto st = budget_->Check(); !st.ok()) return st;
      }
      prefix.insert(prefix.end(), item.begin(), item.end());
    }
    if (hi < 0) {
      // rule ::= prefix tail; tail ::= tail item | ""  (left recursion: constant Earley state).
      auto tail = b_.NewRule("star");
      if (!tail.ok()) return tail;
      std::vector<int32_t> loop = {*tail};
      loop.insert(loop.end(), item.begin(), item.end());
      if (auto st = b_.AddProduction(*tail, loop); !st.ok()) return st;
      if (auto st = b_.AddProduction(*tail, {}); !st.ok()) return st;
      prefix.push_back(*tail);
      if (auto st = b_.AddProduction(*rule, prefix); !st.ok()) return st;
      return *rule;
    }
    // x{lo,hi}: prefix then nested optionals opt_k ::= x opt_{k-1} | "".
    int32_t next = -1;
    for (int64_t i = 0; i < hi - lo; ++i) {
      if (budget_ != nullptr) {
        if (auto st = budget_->Check(); !st.ok()) return st;
      }
      auto opt = b_.NewRule("opt");
      if (!opt.ok()) return opt;
      std::vector<int32_t> body = item;
      if (next >= 0) body.push_back(next);
      if (auto st = b_.AddProduction(*opt, body); !st.ok()) return st;
      if (auto st = b_.AddProduction(*opt, {}); !st.ok()) return st;
      next = *opt;
    }
    if (next >= 0) prefix.push_back(next);
    if (auto st = b_.AddProduction(*rule, prefix); !st.ok()) return st;
    return *rule;
  }

  absl::Status Char(uint32_t* cp) {
    unsigned char c = static_cast<unsigned char>(Peek());
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error("dangling escape");
      char e = Peek();
      ++pos_;
      switch (e) {
        case 'n':
          *cp = '\n';
          return absl::OkStatus();
        case 't':
          *cp = '\t';
          return absl::OkStatus();
        case 'r':
          *cp = '\r';
          return absl::OkStatus();
        case 'f':
          *cp = '\f';
          return absl::OkStatus();
        case 'b':
          *cp = '\b';
          return absl::OkStatus();
        case '0':
          *cp = 0;
          return absl::OkStatus();
        case 'x':
          return Hex(2, cp);
        case 'u':
          return Hex(4, cp);
        case 'U':
          return Hex(8, cp);
        default:
          *cp = static_cast<unsigned char>(e);
          return absl::OkStatus();
      }
    }
    // One UTF-8 encoded code point.
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > text_.size()) return Error("invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) {
      unsigned char d = static_cast<unsigned char>(text_[pos_ + i]);
      if ((d & 0xC0) != 0x80) return Error("invalid UTF-8");
      v = (v << 6) | (d & 0x3F);
    }
    pos_ += n;
    *cp = v;
    return absl::OkStatus();
  }

  absl::Status Hex(int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek()))) {
        return Error("bad hexadecimal escape");
      }
      char h = Peek();
      v = v * 16 +
          (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      ++pos_;
    }
    if (v > 0x10FFFF) return Error("code point out of range");
    *cp = v;
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  CompileBudget* budget_;
  absl::flat_hash_set<std::string> defined_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGrammar(std::string_view text, const GrammarLimits& limits,
                                     CompileBudget* budget) {
  return Parser(text, limits, budget).Parse();
}

}  // namespace tandem::grammar
