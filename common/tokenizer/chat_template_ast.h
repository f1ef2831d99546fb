#pragma once

// The parsed form of a chat template (chat_template_parser.cc builds it, chat_template_eval.cc
// runs it).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/chat_template_value.h"

namespace tandem::chat_template {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: elements
    kDict,     // args: key, value, key, value, ...
    kGetAttr,  // args[0].name
    kGetItem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null entries: omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // op args[0]: "not", "-", "+"
    kBinary,   // args[0] op args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,
    kOr,
    kCond,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  Json literal;
  std::string name;  // name, attribute, filter, test or operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star_args;    // kCall, kFilter: f(*list)
  ExprPtr star_kwargs;  // kCall, kFilter: f(**dict)
};

// The name a {% filter %} block's filter chain reads its body's output from (not a name a
// template can spell).
inline constexpr char kFilterBlockInput[] = " filter block";

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body), else_body
    kFor,          // for targets in expr [if filter]: body, else_body
    kSet,          // set targets = expr, or set target.attr = expr
    kSetBlock,     // set target %}body{% endset
    kMacro,        // macro name(params with defaults): body
    kCallBlock,    // call(params) expr: body (the macro's `caller`, with params)
    kFilterBlock,  // filter chain: body (expr: the chain over kFilterBlockInput)
    kWith,         // with params (name = expr): body, in a scope of its own
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // kFor's "if" clause
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  bool recursive = false;  // kFor: the body may call loop(items) to run itself over items
  // kMacro, kCallBlock: parameters (default may be null); kWith: the names it binds
  std::vector<std::pair<std::string, ExprPtr>> params;
};

}  // namespace tandem::chat_template
