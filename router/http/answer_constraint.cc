#include "router/http/answer_constraint.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/regex_to_grammar.h"

namespace tandem {
namespace {

constexpr std::string_view kAnswerPrefix = "tandem-answer-";
constexpr std::string_view kUserPrefix = "tandem-user-";

std::vector<uint32_t> CodePoints(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < len && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string Literal(uint32_t cp) { return absl::StrCat("\"", grammar::EscapeCodePoint(cp), "\""); }

std::string NotIn(std::initializer_list<uint32_t> cps) {
  std::string out = "[^";
  for (uint32_t cp : cps) out += grammar::EscapeCodePoint(cp);
  return out + "]";
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

}  // namespace

absl::StatusOr<std::string> TextUntilTagGrammar(std::string_view name, std::string_view tag) {
  const std::vector<uint32_t> t = CodePoints(tag);
  if (t.size() < 2) return absl::InvalidArgumentError("reasoning tag too short");
  for (size_t i = 1; i < t.size(); ++i) {
    if (t[i] == t[0])
      return absl::InvalidArgumentError("reasoning tag repeats its first character");
  }
  const uint32_t c0 = t[0];
  const size_t m = t.size() - 1;  // r1..rm = t[1..m]
  // Text without the tag, then the tag: ( [^c0] | c0 again* break )* c0 again* r1..rm, where
  // `again` is a partial r1..rk (k < m) cut short by another c0, and `break` a partial r1..rk
  // followed by a character that is neither c0 nor r(k+1).
  std::string again;
  for (size_t k = 1; k < m; ++k) absl::StrAppend(&again, "( ", Literal(t[k]), " ");
  for (size_t k = 1; k < m; ++k) again += ")? ";
  std::string brk;
  for (size_t k = 1; k <= m; ++k) {
    absl::StrAppend(&brk, k > 1 ? "( " : "", NotIn({c0, t[k]}), k < m ? " | " : "",
                    k < m ? Literal(t[k]) + " " : "");
  }
  for (size_t k = 2; k <= m; ++k) brk += ")";
  std::string rest;
  for (size_t k = 1; k <= m; ++k) absl::StrAppend(&rest, Literal(t[k]), " ");
  const std::string n(name);
  return absl::StrCat(n, "-again ::= ", again, Literal(c0), "\n",  //
                      n, "-break ::= ", brk, "\n",                 //
                      n, " ::= ( ", NotIn({c0}), " | ", Literal(c0), " ", n, "-again* ", n,
                      "-break )* ", Literal(c0), " ", n, "-again* ", rest, "\n");
}

std::string PrefixGrammarRules(std::string_view g, std::string_view prefix) {
  std::string out;
  out.reserve(g.size() + 64);
  size_t i = 0;
  while (i < g.size()) {
    const char c = g[i];
    if (c == '"' || c == '[') {  // a literal or a class: copied as is, escapes included
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < g.size() && g[j] != close) j += g[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, g.size());
      out.append(g.substr(i, j - i));
      i = j;
    } else if (c == '#') {  // a comment, to the end of the line
      size_t j = g.find('\n', i);
      if (j == std::string_view::npos) j = g.size();
      out.append(g.substr(i, j - i));
      i = j;
    } else if (c == '{') {  // repetition bounds {m,n}
      size_t j = g.find('}', i);
      j = j == std::string_view::npos ? g.size() : j + 1;
      out.append(g.substr(i, j - i));
      i = j;
    } else if (NameChar(c)) {
      size_t j = i;
      while (j < g.size() && NameChar(g[j])) ++j;
      out.append(prefix);
      out.append(g.substr(i, j - i));
      i = j;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

absl::Status ConstrainAnswerOnly(ReasoningParser parser, ReasoningStart start,
                                 v1::OutputConstraint* c) {
  if (start == ReasoningStart::kAnswer || c->kind_case() == v1::OutputConstraint::KIND_NOT_SET) {
    return absl::OkStatus();
  }
  const std::string answer_root = std::string(kAnswerPrefix) + "root";
  std::string answer;  // rules defining answer_root
  switch (c->kind_case()) {
    case v1::OutputConstraint::kJsonSchema: {
      grammar::JsonSchemaOptions o;
      o.prefix = std::string(kAnswerPrefix);
      o.include_base_rules = false;
      o.strict = c->has_strict() ? c->strict() : true;
      auto g = grammar::JsonSchemaToGrammar(c->json_schema(), o);
      if (!g.ok()) return g.status();
      answer = absl::StrCat(*g, grammar::JsonBaseRules());
      break;
    }
    case v1::OutputConstraint::kJsonObject:
      answer = absl::StrCat(answer_root, " ::= json-object\n", grammar::JsonBaseRules());
      break;
    case v1::OutputConstraint::kRegex: {
      auto expr = grammar::RegexToGrammarExpr(c->regex());
      if (!expr.ok()) return expr.status();
      answer = absl::StrCat(answer_root, " ::= ", *expr, "\n");
      break;
    }
    case v1::OutputConstraint::kChoice: {
      answer = absl::StrCat(answer_root, " ::= ");
      for (int i = 0; i < c->choice().choices_size(); ++i) {
        absl::StrAppend(&answer, i ? " | " : "", grammar::GrammarLiteral(c->choice().choices(i)));
      }
      answer += "\n";
      break;
    }
    case v1::OutputConstraint::kGrammar:
      answer = absl::StrCat(answer_root, " ::= ", std::string(kUserPrefix), "root\n",
                            PrefixGrammarRules(c->grammar(), kUserPrefix), "\n");
      break;
    default:
      return absl::OkStatus();
  }
  const ReasoningTags tags = TagsOf(parser);
  auto body = TextUntilTagGrammar("tandem-reasoning", tags.close);
  if (!body.ok()) return body.status();
  const std::string block =
      start == ReasoningStart::kInReasoning
          ? std::string("tandem-reasoning")
          : absl::StrCat("( ", grammar::GrammarLiteral(tags.open), " tandem-reasoning )?");
  const std::string root =
      absl::StrCat("root ::= ", block, " [ \\t\\r\\n]{0,8} ", answer_root, "\n");
  c->set_grammar(absl::StrCat(root, *body, answer));
  return absl::OkStatus();
}

}  // namespace tandem
