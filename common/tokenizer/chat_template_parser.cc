#include "common/tokenizer/chat_template_parser.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template_lexer.h"

namespace tandem::chat_template {
namespace {

constexpr int kMaxDepth = 64;  // nesting of expressions and of blocks

ExprPtr MakeExpr(Expr::Kind kind) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  return e;
}

ExprPtr MakeExpr(Expr::Kind kind, std::string name, ExprPtr a, ExprPtr b = nullptr) {
  ExprPtr e = MakeExpr(kind);
  e->name = std::move(name);
  e->args.push_back(std::move(a));
  if (b) e->args.push_back(std::move(b));
  return e;
}

// Parses the tokens of one tag. Errors are recorded (the first wins) and parsing unwinds by
// returning null.
class TagParser {
 public:
  TagParser(const std::vector<Token>& tokens, int line) : tokens_(tokens), line_(line) {}

  const std::string& error() const { return error_; }
  bool ok() const { return error_.empty(); }
  bool AtEnd() const { return pos_ >= tokens_.size(); }
  const Token* Peek(size_t k = 0) const {
    return pos_ + k < tokens_.size() ? &tokens_[pos_ + k] : nullptr;
  }
  bool IsOp(absl::string_view op, size_t k = 0) const {
    const Token* t = Peek(k);
    return t != nullptr && t->type == Token::Type::kOp && t->text == op;
  }
  bool IsName(absl::string_view name, size_t k = 0) const {
    const Token* t = Peek(k);
    return t != nullptr && t->type == Token::Type::kName && t->text == name;
  }
  bool SkipOp(absl::string_view op) { return IsOp(op) ? (++pos_, true) : false; }
  bool SkipName(absl::string_view name) { return IsName(name) ? (++pos_, true) : false; }

  void Fail(absl::string_view message) {
    if (error_.empty()) error_ = absl::StrCat("chat template: line ", line_, ": ", message);
  }
  bool ExpectOp(absl::string_view op) {
    if (SkipOp(op)) return true;
    Fail(absl::StrCat("expected '", op, "'"));
    return false;
  }
  std::string ExpectName() {
    const Token* t = Peek();
    if (t == nullptr || t->type != Token::Type::kName) {
      Fail("expected a name");
      return "";
    }
    ++pos_;
    return t->text;
  }
  void ExpectEnd() {
    if (!AtEnd()) Fail(absl::StrCat("unexpected '", Peek()->text, "'"));
  }

  ExprPtr Expression(bool with_condition = true) {
    if (!Enter()) return nullptr;
    ExprPtr e = Or();
    if (e && with_condition && SkipName("if")) {
      ExprPtr cond = Or();
      ExprPtr otherwise = SkipName("else") ? Expression() : nullptr;
      ExprPtr c = MakeExpr(Expr::Kind::kCond);
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    --depth_;
    return ok() ? std::move(e) : nullptr;
  }

 private:
  bool Enter() {
    if (++depth_ > kMaxDepth) {
      Fail("expression nested too deeply");
      return false;
    }
    return ok();
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (e && SkipName("or")) e = MakeExpr(Expr::Kind::kOr, "or", std::move(e), And());
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (e && SkipName("and")) e = MakeExpr(Expr::Kind::kAnd, "and", std::move(e), Not());
    return e;
  }
  ExprPtr Not() {
    if (IsName("not") && !IsName("in", 1)) {
      ++pos_;
      if (!Enter()) return nullptr;
      ExprPtr e = MakeExpr(Expr::Kind::kUnary, "not", Not());
      --depth_;
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr e = Math1();
    while (e && ok()) {
      std::string op;
      for (absl::string_view c : {"==", "!=", "<", "<=", ">", ">="}) {
        if (IsOp(c)) op = std::string(c);
      }
      if (!op.empty()) {
        ++pos_;
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      e = MakeExpr(Expr::Kind::kBinary, op, std::move(e), Math1());
    }
    return e;
  }
  ExprPtr Binary(std::initializer_list<absl::string_view> ops, ExprPtr (TagParser::*next)()) {
    ExprPtr e = (this->*next)();
    while (e && ok()) {
      std::string op;
      for (absl::string_view c : ops) {
        if (IsOp(c)) op = std::string(c);
      }
      if (op.empty()) break;
      ++pos_;
      e = MakeExpr(Expr::Kind::kBinary, op, std::move(e), (this->*next)());
    }
    return e;
  }
  ExprPtr Math1() { return Binary({"+", "-"}, &TagParser::Concat); }
  ExprPtr Concat() { return Binary({"~"}, &TagParser::Math2); }
  ExprPtr Math2() { return Binary({"*", "/", "//", "%"}, &TagParser::Pow); }
  ExprPtr Pow() { return Binary({"**"}, &TagParser::UnaryWithFilters); }
  ExprPtr UnaryWithFilters() { return Unary(true); }

  ExprPtr Unary(bool with_filter) {
    if (!Enter()) return nullptr;
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      std::string op = Peek()->text;
      ++pos_;
      e = MakeExpr(Expr::Kind::kUnary, op, Unary(false));
    } else {
      e = Postfix(Primary());
    }
    if (e && with_filter) e = FilterExpr(std::move(e));
    --depth_;
    return ok() ? std::move(e) : nullptr;
  }

  ExprPtr Primary() {
    const Token* t = Peek();
    if (t == nullptr) {
      Fail("expected an expression");
      return nullptr;
    }
    ++pos_;
    switch (t->type) {
      case Token::Type::kName: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral);
        if (t->text == "true" || t->text == "True") {
          e->literal = true;
        } else if (t->text == "false" || t->text == "False") {
          e->literal = false;
        } else if (t->text == "none" || t->text == "None") {
          e->literal = nullptr;
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t->text;
        }
        return e;
      }
      case Token::Type::kString: {
        std::string s = t->text;
        while (Peek() != nullptr && Peek()->type == Token::Type::kString) s += tokens_[pos_++].text;
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral);
        e->literal = std::move(s);
        return e;
      }
      case Token::Type::kInt:
      case Token::Type::kFloat: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral);
        e->literal = t->value;
        return e;
      }
      case Token::Type::kOp:
        break;
    }
    if (t->text == "(") {
      if (SkipOp(")")) return MakeExpr(Expr::Kind::kList);  // (): an empty tuple
      ExprPtr e = Expression();
      if (e && IsOp(",")) {  // a tuple: evaluated as a list
        ExprPtr list = MakeExpr(Expr::Kind::kList);
        list->args.push_back(std::move(e));
        while (SkipOp(",") && !IsOp(")")) list->args.push_back(Expression());
        e = std::move(list);
      }
      ExpectOp(")");
      return e;
    }
    if (t->text == "[") {
      ExprPtr list = MakeExpr(Expr::Kind::kList);
      while (ok() && !IsOp("]")) {
        list->args.push_back(Expression());
        if (!SkipOp(",")) break;
      }
      ExpectOp("]");
      return list;
    }
    if (t->text == "{") {
      ExprPtr dict = MakeExpr(Expr::Kind::kDict);
      while (ok() && !IsOp("}")) {
        dict->args.push_back(Expression());
        ExpectOp(":");
        dict->args.push_back(Expression());
        if (!SkipOp(",")) break;
      }
      ExpectOp("}");
      return dict;
    }
    Fail(absl::StrCat("unexpected '", t->text, "'"));
    return nullptr;
  }

 public:
  // The filters of a {% filter %} tag ("name(args) | name ..."), applied to the block's output.
  ExprPtr FilterBlockChain() {
    ExprPtr e = MakeExpr(Expr::Kind::kName);
    e->name = kFilterBlockInput;
    do {
      ExprPtr f = MakeExpr(Expr::Kind::kFilter, ExpectName(), std::move(e));
      if (SkipOp("(")) CallArgs(f.get());
      e = std::move(f);
    } while (ok() && SkipOp("|"));
    return ok() ? std::move(e) : nullptr;
  }

  // Assignment targets: "a", "a, b" or "(a, b)".
  void Targets(std::vector<std::string>* targets) {
    const bool paren = SkipOp("(");
    do {
      targets->push_back(ExpectName());
    } while (ok() && SkipOp(","));
    if (paren) ExpectOp(")");
  }

  // An expression, or several separated by commas: a tuple, evaluated as a list.
  ExprPtr TupleExpression() {
    ExprPtr e = Expression();
    if (!e || !IsOp(",")) return e;
    ExprPtr list = MakeExpr(Expr::Kind::kList);
    list->args.push_back(std::move(e));
    while (ok() && SkipOp(",") && !AtEnd()) list->args.push_back(Expression());
    return ok() ? std::move(list) : nullptr;
  }

  // Parameters "(a, b=default, ...)" of a macro or a call block, the "(" already consumed.
  void Params(std::vector<std::pair<std::string, ExprPtr>>* params) {
    while (ok() && !IsOp(")")) {
      std::string name = ExpectName();
      ExprPtr def = SkipOp("=") ? Expression() : nullptr;
      params->emplace_back(std::move(name), std::move(def));
      if (!SkipOp(",")) break;
    }
    ExpectOp(")");
  }

 private:
  // (args, kw=args, *list, **dict) after the "(" was consumed; appends to `call`.
  void CallArgs(Expr* call) {
    while (ok() && !IsOp(")")) {
      if (SkipOp("**")) {
        call->star_kwargs = Expression();
      } else if (SkipOp("*")) {
        call->star_args = Expression();
      } else if (Peek() != nullptr && Peek()->type == Token::Type::kName && IsOp("=", 1)) {
        std::string key = Peek()->text;
        pos_ += 2;
        call->kwargs.emplace_back(std::move(key), Expression());
      } else {
        call->args.push_back(Expression());
      }
      if (!SkipOp(",")) break;
    }
    ExpectOp(")");
  }

  ExprPtr Postfix(ExprPtr e) {
    while (e && ok()) {
      if (SkipOp(".")) {
        const Token* t = Peek();
        if (t != nullptr && t->type == Token::Type::kInt) {
          ++pos_;
          ExprPtr index = MakeExpr(Expr::Kind::kLiteral);
          index->literal = t->value;
          e = MakeExpr(Expr::Kind::kGetItem, "", std::move(e), std::move(index));
        } else {
          e = MakeExpr(Expr::Kind::kGetAttr, ExpectName(), std::move(e));
        }
      } else if (SkipOp("[")) {
        ExprPtr slice[3];
        bool is_slice = false;
        if (!IsOp(":")) slice[0] = Expression();
        for (int k = 1; k < 3 && SkipOp(":"); ++k) {
          is_slice = true;
          if (!IsOp(":") && !IsOp("]")) slice[k] = Expression();
        }
        ExpectOp("]");
        if (is_slice) {
          ExprPtr s = MakeExpr(Expr::Kind::kSlice);
          s->args.push_back(std::move(e));
          for (auto& part : slice) s->args.push_back(std::move(part));
          e = std::move(s);
        } else {
          e = MakeExpr(Expr::Kind::kGetItem, "", std::move(e), std::move(slice[0]));
        }
      } else if (SkipOp("(")) {
        ExprPtr call = MakeExpr(Expr::Kind::kCall);
        call->args.push_back(std::move(e));
        CallArgs(call.get());
        e = std::move(call);
      } else {
        break;
      }
    }
    return e;
  }

  ExprPtr FilterExpr(ExprPtr e) {
    while (e && ok()) {
      if (SkipOp("|")) {
        ExprPtr f = MakeExpr(Expr::Kind::kFilter, ExpectName(), std::move(e));
        if (SkipOp("(")) CallArgs(f.get());
        e = std::move(f);
      } else if (SkipName("is")) {
        const bool negated = SkipName("not");
        ExprPtr test = MakeExpr(Expr::Kind::kTest, ExpectName(), std::move(e));
        test->negated = negated;
        const Token* t = Peek();
        if (SkipOp("(")) {
          CallArgs(test.get());
        } else if (t != nullptr && (t->type != Token::Type::kOp || IsOp("[") || IsOp("{")) &&
                   !(t->type == Token::Type::kName &&
                     (t->text == "else" || t->text == "or" || t->text == "and" || t->text == "if" ||
                      t->text == "is" || t->text == "in" || t->text == "not"))) {
          test->args.push_back(Postfix(Primary()));
        }
        e = std::move(test);
      } else {
        break;
      }
    }
    return e;
  }

  const std::vector<Token>& tokens_;
  int line_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string error_;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::StatusOr<Body> Parse() {
    Body body = ParseBody({});
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    return body;
  }

 private:
  void Fail(const std::string& message) {
    if (error_.empty()) error_ = message;
  }
  void Fail(int line, absl::string_view message) {
    Fail(absl::StrCat("chat template: line ", line, ": ", message));
  }
  bool Check(const TagParser& p) {
    if (!p.ok()) Fail(p.error());
    return p.ok();
  }

  // Parses pieces until a statement whose keyword is in `ends` (returned in *end, with its
  // parser positioned after the keyword); an empty set parses to the end of the template.
  Body ParseBody(std::initializer_list<absl::string_view> ends, std::string* end = nullptr,
                 std::unique_ptr<TagParser>* end_parser = nullptr) {
    Body body;
    if (++depth_ > kMaxDepth) {
      Fail("chat template: blocks nested too deeply");
      return body;
    }
    while (error_.empty() && next_ < pieces_.size()) {
      const Piece& piece = pieces_[next_++];
      if (piece.kind == Piece::Kind::kText) {
        auto node = std::make_unique<Node>();
        node->text = piece.text;
        body.push_back(std::move(node));
        continue;
      }
      auto parser = std::make_unique<TagParser>(piece.tokens, piece.line);
      if (piece.kind == Piece::Kind::kOutput) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->expr = parser->Expression();
        parser->ExpectEnd();
        if (!Check(*parser)) break;
        body.push_back(std::move(node));
        continue;
      }
      const std::string keyword = parser->ExpectName();
      if (!Check(*parser)) break;
      for (absl::string_view e : ends) {
        if (keyword == e) {
          if (end != nullptr) *end = keyword;
          if (end_parser != nullptr) *end_parser = std::move(parser);
          --depth_;
          return body;
        }
      }
      Statement(keyword, *parser, piece.line, &body);
    }
    if (error_.empty() && ends.size() > 0) {
      Fail(absl::StrCat("chat template: missing {% ", *ends.begin(), " %}"));
    }
    --depth_;
    return body;
  }

  void Statement(const std::string& keyword, TagParser& p, int line, Body* body) {
    auto node = std::make_unique<Node>();
    std::string end;
    std::unique_ptr<TagParser> next;
    if (keyword == "if") {
      node->kind = Node::Kind::kIf;
      ExprPtr cond = p.Expression();
      p.ExpectEnd();
      while (Check(p) && error_.empty()) {
        Body branch = ParseBody({"elif", "else", "endif"}, &end, &next);
        node->branches.emplace_back(std::move(cond), std::move(branch));
        if (!error_.empty() || end != "elif") break;
        cond = next->Expression();
        next->ExpectEnd();
        if (!Check(*next)) return;
      }
      if (error_.empty() && end == "else") {
        next->ExpectEnd();
        node->else_body = ParseBody({"endif"}, &end, &next);
      }
    } else if (keyword == "for") {
      node->kind = Node::Kind::kFor;
      p.Targets(&node->targets);
      if (p.ok() && !p.SkipName("in")) p.Fail("expected 'in'");
      if (p.ok()) node->expr = p.Expression(/*with_condition=*/false);
      if (p.ok() && p.SkipName("if")) node->filter = p.Expression();
      if (p.ok() && p.SkipName("recursive")) node->recursive = true;  // loop(items) recurses
      p.ExpectEnd();
      if (!Check(p)) return;
      node->body = ParseBody({"else", "endfor"}, &end, &next);
      if (error_.empty() && end == "else") node->else_body = ParseBody({"endfor"}, &end, &next);
    } else if (keyword == "set") {
      node->kind = Node::Kind::kSet;
      if (p.IsOp("(")) {
        p.Targets(&node->targets);
      } else {
        node->targets.push_back(p.ExpectName());
        if (p.SkipOp(".")) {
          node->attr = p.ExpectName();
        } else {
          while (p.ok() && p.SkipOp(",")) node->targets.push_back(p.ExpectName());
        }
      }
      if (p.ok() && p.AtEnd() && node->attr.empty() && node->targets.size() == 1) {
        node->kind = Node::Kind::kSetBlock;
        node->body = ParseBody({"endset"}, &end, &next);
      } else if (p.ExpectOp("=")) {
        node->expr = p.TupleExpression();
        p.ExpectEnd();
      }
      if (!Check(p)) return;
    } else if (keyword == "macro") {
      node->kind = Node::Kind::kMacro;
      node->targets.push_back(p.ExpectName());
      if (p.ExpectOp("(")) p.Params(&node->params);
      p.ExpectEnd();
      if (!Check(p)) return;
      node->body = ParseBody({"endmacro"}, &end, &next);
    } else if (keyword == "call") {  // {% call(params) macro(args) %}caller's body{% endcall %}
      node->kind = Node::Kind::kCallBlock;
      if (p.SkipOp("(")) p.Params(&node->params);
      if (p.ok()) node->expr = p.Expression();
      if (p.ok() && node->expr->kind != Expr::Kind::kCall) p.Fail("{% call %} expects a call");
      p.ExpectEnd();
      if (!Check(p)) return;
      node->body = ParseBody({"endcall"}, &end, &next);
    } else if (keyword == "with") {  // {% with a = 1, b = x %}body{% endwith %}: a scope
      node->kind = Node::Kind::kWith;
      while (p.ok() && !p.AtEnd()) {
        std::string name = p.ExpectName();
        if (p.ExpectOp("=")) node->params.emplace_back(std::move(name), p.Expression());
        if (!p.SkipOp(",")) break;
      }
      p.ExpectEnd();
      if (!Check(p)) return;
      node->body = ParseBody({"endwith"}, &end, &next);
    } else if (keyword == "filter") {  // {% filter name(args) | ... %}body{% endfilter %}
      node->kind = Node::Kind::kFilterBlock;
      node->expr = p.FilterBlockChain();
      p.ExpectEnd();
      if (!Check(p)) return;
      node->body = ParseBody({"endfilter"}, &end, &next);
    } else if (keyword == "break" || keyword == "continue") {
      node->kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      p.ExpectEnd();
      if (!Check(p)) return;
    } else if (keyword == "generation") {  // Hugging Face's assistant-mask marker
      p.ExpectEnd();
      if (!Check(p)) return;
      Body inner = ParseBody({"endgeneration"}, &end, &next);
      for (auto& n : inner) body->push_back(std::move(n));
      return;
    } else {
      Fail(line, absl::StrCat("unsupported tag '", keyword, "'"));
      return;
    }
    if (next) {
      next->ExpectEnd();
      Check(*next);
    }
    body->push_back(std::move(node));
  }

  std::vector<Piece> pieces_;
  size_t next_ = 0;
  int depth_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source) {
  auto pieces = LexTemplate(source);
  if (!pieces.ok()) return pieces.status();
  return TemplateParser(std::move(pieces).value()).Parse();
}

}  // namespace tandem::chat_template
