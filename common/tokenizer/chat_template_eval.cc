#include "common/tokenizer/chat_template_eval.h"

#include <algorithm>
#include <ctime>
#include <iterator>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::chat_template {
namespace {

class Evaluator {
 public:
  explicit Evaluator(const RenderLimits& limits) : limits_(limits), budget_(limits.budget) {}

  absl::StatusOr<std::string> Run(const Body& body, const Json& variables) {
    scopes_.emplace_back();
    DefineGlobals();
    if (variables.is_object()) {
      for (auto it = variables.begin(); it != variables.end(); ++it) {
        scopes_.front()[it.key()] = Value(it.value());
      }
    }
    std::string out;
    TANDEM_ASSIGN_OR_RETURN(Flow flow, Exec(body, &out));
    (void)flow;
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  void DefineGlobals() {
    Scope& g = scopes_.front();
    g["range"] = Value::Callable([](CallArgs& a) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      std::vector<int64_t> n;
      for (const Value& v : a.positional) {
        if (!v.is_data() || !v.data().is_number_integer()) return TypeError("range: integers");
        n.push_back(v.data().get<int64_t>());
      }
      if (n.size() == 1) stop = n[0];
      if (n.size() >= 2) start = n[0], stop = n[1];
      if (n.size() == 3) step = n[2];
      if (n.empty() || n.size() > 3 || step == 0) return TypeError("range: bad arguments");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 100000) return TypeError("range: too many items");
        out.push_back(i);
      }
      return Value(std::move(out));
    });
    g["namespace"] = Value::Callable([](CallArgs& a) -> absl::StatusOr<Value> {
      Json obj = Json::object();
      if (!a.positional.empty() && a.positional[0].is_object()) obj = a.positional[0].data();
      for (auto& [k, v] : a.keyword) obj[k] = v.data();
      return Value::Namespace(std::move(obj));
    });
    g["dict"] = Value::Callable([](CallArgs& a) -> absl::StatusOr<Value> {
      Json obj = Json::object();
      for (auto& [k, v] : a.keyword) obj[k] = v.data();
      return Value(std::move(obj));
    });
    g["raise_exception"] = Value::Callable([](CallArgs& a) -> absl::StatusOr<Value> {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template: ", a.positional.empty() ? "error" : a.positional[0].ToString()));
    });
    g["strftime_now"] = Value::Callable([](CallArgs& a) -> absl::StatusOr<Value> {
      if (a.positional.empty() || !a.positional[0].is_string())
        return TypeError("strftime_now: format");
      const std::time_t now = std::time(nullptr);
      std::tm tm;
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n =
          std::strftime(buf, sizeof buf, a.positional[0].data().get<std::string>().c_str(), &tm);
      return Value(Json(std::string(buf, n)));
    });
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  absl::Status Emit(const std::string& s, std::string* out) {
    if (out->size() + s.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError("chat template: output longer than the limit");
    }
    *out += s;
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const auto& node : body) {
      TANDEM_RETURN_IF_ERROR(budget_.Step());
      TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecNode(*node, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecNode(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kText:
        TANDEM_RETURN_IF_ERROR(Emit(n.text, out));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        TANDEM_RETURN_IF_ERROR(Emit(v.ToString(), out));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          TANDEM_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) return Exec(body, out);
        }
        return Exec(n.else_body, out);
      case Node::Kind::kFor:
        return ExecFor(n, out, nullptr, 1);
      case Node::Kind::kSet: {
        TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (!n.attr.empty()) {
          Value target = Lookup(n.targets[0]);
          if (!target.is_namespace()) {
            return TypeError(absl::StrCat("cannot assign an attribute of '", n.targets[0], "'"));
          }
          target.mutable_namespace()[n.attr] = v.data();
        } else {
          TANDEM_RETURN_IF_ERROR(Assign(n.targets, v));
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        TANDEM_RETURN_IF_ERROR(Exec(n.body, &captured).status());
        scopes_.back()[n.targets[0]] = Value(Json(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        scopes_.back()[n.targets[0]] = MakeMacro(n);
        return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        TANDEM_ASSIGN_OR_RETURN(Value v, EvalCall(*n.expr, MakeCaller(n)));
        TANDEM_RETURN_IF_ERROR(Emit(v.ToString(), out));
        return Flow::kNormal;
      }
      case Node::Kind::kFilterBlock: {
        std::string captured;
        TANDEM_RETURN_IF_ERROR(Exec(n.body, &captured).status());
        scopes_.emplace_back();
        scopes_.back()[kFilterBlockInput] = Value(Json(std::move(captured)));
        absl::StatusOr<Value> v = Eval(*n.expr);
        scopes_.pop_back();
        if (!v.ok()) return v.status();
        TANDEM_RETURN_IF_ERROR(Emit(v->ToString(), out));
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        Scope scope;  // the values are computed in the enclosing scope
        for (const auto& [name, expr] : n.params) {
          TANDEM_ASSIGN_OR_RETURN(scope[name], Eval(*expr));
        }
        scopes_.push_back(std::move(scope));
        absl::StatusOr<Flow> flow = Exec(n.body, out);
        scopes_.pop_back();
        return flow;
      }
      case Node::Kind::kBreak:
        return loop_depth_ > 0 ? Flow::kBreak : Flow::kNormal;
      case Node::Kind::kContinue:
        return loop_depth_ > 0 ? Flow::kContinue : Flow::kNormal;
    }
    return Flow::kNormal;
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return absl::OkStatus();
    }
    if (!v.is_array() || v.data().size() != targets.size()) {
      return TypeError(absl::StrCat("cannot unpack into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = Value(v.data()[i]);
    return absl::OkStatus();
  }

  // A for loop over its expression's items (or, called as loop(items) in a recursive loop,
  // over `items`, one level deeper).
  absl::StatusOr<Flow> ExecFor(const Node& n, std::string* out, const Value* items_override,
                               int64_t depth) {
    Value seq;
    if (items_override != nullptr) {
      seq = *items_override;
    } else {
      TANDEM_ASSIGN_OR_RETURN(seq, Eval(*n.expr));
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<Json> items, Iterate(seq));
    if (n.filter) {  // the loop's "if" clause filters before loop.length and friends
      std::vector<Json> kept;
      for (Json& item : items) {
        scopes_.emplace_back();
        absl::Status st = Assign(n.targets, Value(item));
        absl::StatusOr<Value> keep = st.ok() ? Eval(*n.filter) : absl::StatusOr<Value>(st);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    ++loop_depth_;
    loops_.push_back({&n, depth});
    absl::Status status;
    for (int64_t i = 0; i < len && status.ok(); ++i) {
      scopes_.emplace_back();
      Json loop = {{"index0", i},         {"index", i + 1},
                   {"revindex", len - i}, {"revindex0", len - i - 1},
                   {"first", i == 0},     {"last", i == len - 1},
                   {"length", len},       {"depth", depth},
                   {"depth0", depth - 1}};
      if (i > 0) loop["previtem"] = items[i - 1];
      if (i + 1 < len) loop["nextitem"] = items[i + 1];
      scopes_.back()["loop"] = Value(std::move(loop));
      status = Assign(n.targets, Value(items[i]));
      absl::StatusOr<Flow> flow = status.ok() ? Exec(n.body, out) : absl::StatusOr<Flow>(status);
      scopes_.pop_back();
      if (!flow.ok()) status = flow.status();
      if (flow.ok() && *flow == Flow::kBreak) break;
    }
    loops_.pop_back();
    --loop_depth_;
    if (!status.ok()) return status;
    return Flow::kNormal;
  }

  // A macro: its parameters bound from the call's arguments (the rest in `varargs` and
  // `kwargs`, a call block's body in `caller`), its body rendered in a scope of its own.
  Value MakeMacro(const Node& n) {
    return Value::Callable([this, &n](CallArgs& a) -> absl::StatusOr<Value> {
      Scope scope;
      Json varargs = Json::array(), kwargs = Json::object();
      for (size_t i = n.params.size(); i < a.positional.size(); ++i)
        varargs.push_back(a.positional[i].data());
      for (const auto& keyword : a.keyword) {
        const std::string& key = keyword.first;
        const bool param = std::any_of(n.params.begin(), n.params.end(),
                                       [&key](const auto& p) { return p.first == key; });
        if (key == "caller" && keyword.second.is_callable()) {
          scope["caller"] = keyword.second;
        } else if (!param) {
          kwargs[key] = keyword.second.data();
        }
      }
      scope["varargs"] = Value(std::move(varargs));
      scope["kwargs"] = Value(std::move(kwargs));
      for (size_t i = 0; i < n.params.size(); ++i) {
        Value v = Arg(a, i, n.params[i].first);
        if (v.is_undefined() && n.params[i].second) {
          TANDEM_ASSIGN_OR_RETURN(v, Eval(*n.params[i].second));
        }
        scope[n.params[i].first] = std::move(v);
      }
      return RenderBody(n.body, std::move(scope), scopes_.size());
    });
  }

  // A call block's body as the `caller` of its macro: rendered with the call site's names
  // (not the macro's locals) and its own parameters.
  Value MakeCaller(const Node& n) {
    const size_t site_depth = scopes_.size();
    return Value::Callable([this, &n, site_depth](CallArgs& a) -> absl::StatusOr<Value> {
      Scope scope;
      for (size_t i = 0; i < n.params.size(); ++i) {
        Value v = Arg(a, i, n.params[i].first);
        if (v.is_undefined() && n.params[i].second) {
          TANDEM_ASSIGN_OR_RETURN(v, Eval(*n.params[i].second));
        }
        scope[n.params[i].first] = std::move(v);
      }
      return RenderBody(n.body, std::move(scope), site_depth);
    });
  }

  // Renders `body` with `scope` on top of the first `visible` scopes (those above are set
  // aside meanwhile) and returns the text.
  absl::StatusOr<Value> RenderBody(const Body& body, Scope scope, size_t visible) {
    if (call_depth_ >= limits_.max_call_depth) return TypeError("macro calls nested too deeply");
    visible = std::min(visible, scopes_.size());
    std::vector<Scope> hidden(std::make_move_iterator(scopes_.begin() + visible),
                              std::make_move_iterator(scopes_.end()));
    scopes_.resize(visible);
    ++call_depth_;
    scopes_.push_back(std::move(scope));
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string rendered;
    absl::StatusOr<Flow> flow = Exec(body, &rendered);
    loop_depth_ = saved_loops;
    scopes_.resize(visible);
    for (Scope& s : hidden) scopes_.push_back(std::move(s));
    --call_depth_;
    if (!flow.ok()) return flow.status();
    return Value(Json(std::move(rendered)));
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    if (e.star_args) {  // f(*list)
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.star_args));
      TANDEM_ASSIGN_OR_RETURN(std::vector<Json> items, Iterate(v));
      for (Json& item : items) args.positional.emplace_back(std::move(item));
    }
    for (const auto& [key, expr] : e.kwargs) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.keyword.emplace_back(key, std::move(v));
    }
    if (e.star_kwargs) {  // f(**dict)
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.star_kwargs));
      if (!v.is_object()) return TypeError("argument after ** must be a mapping");
      for (auto it = v.data().begin(); it != v.data().end(); ++it)
        args.keyword.emplace_back(it.key(), Value(it.value()));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    TANDEM_RETURN_IF_ERROR(budget_.Step());
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value(e.literal);
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kDict: {
        Json out = e.kind == Expr::Kind::kList ? Json::array() : Json::object();
        for (size_t i = 0; i < e.args.size(); ++i) {
          TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
          if (e.kind == Expr::Kind::kList) {
            out.push_back(v.data());
            continue;
          }
          if (!v.is_data() || v.data().is_structured()) return TypeError("unhashable dict key");
          TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*e.args[++i]));
          out[DictKey(v.data())] = value.data();
        }
        return Value(std::move(out));
      }
      case Expr::Kind::kGetAttr: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        TANDEM_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value part[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k + 1]) {
            TANDEM_ASSIGN_OR_RETURN(part[k], Eval(*e.args[k + 1]));
          }
        }
        return Slice(obj, part[0], part[1], part[2]);
      }
      case Expr::Kind::kCall:
        return EvalCall(e);
      case Expr::Kind::kFilter: {
        TANDEM_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0]));
        TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, input, args, &budget_);
      }
      case Expr::Kind::kTest: {
        TANDEM_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0]));
        TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        TANDEM_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, input, args));
        return Value(Json(r != e.negated));
      }
      case Expr::Kind::kUnary: {
        TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (e.name == "not") return Value(Json(!v.Truthy()));
        if (v.is_data() && v.data().is_boolean()) v = Value(Json(v.data().get<bool>() ? 1 : 0));
        if (!v.is_number()) return TypeError(absl::StrCat("bad operand type for unary ", e.name));
        if (e.name == "+") return v;
        if (v.data().is_number_float()) return Value(Json(-v.data().get<double>()));  // -0.0
        Budget unlimited;
        return BinaryOp("-", Value(Json(0)), v, &unlimited);
      }
      case Expr::Kind::kBinary: {
        TANDEM_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        TANDEM_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return BinaryOp(e.name, a, b, &budget_);
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {  // Python's: the deciding operand itself
        TANDEM_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kCond: {
        TANDEM_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
        if (c.Truthy()) return Eval(*e.args[1]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value();
      }
    }
    return Value();
  }

  // callee(args); `caller`, when set, is passed as the keyword caller (a {% call %} block).
  absl::StatusOr<Value> EvalCall(const Expr& e, Value caller = Value()) {
    const Expr& callee = *e.args[0];
    TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
    if (callee.kind == Expr::Kind::kName && callee.name == "loop" && !loops_.empty()) {
      return RecurseLoop(args);
    }
    if (caller.is_callable()) args.keyword.emplace_back("caller", std::move(caller));
    if (callee.kind == Expr::Kind::kGetAttr) {
      TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      absl::StatusOr<Value> r = CallMethod(obj, callee.name, args, &budget_);
      if (!absl::IsNotFound(r.status())) return r;
      Value fn = GetAttr(obj, callee.name);
      if (fn.is_callable()) return fn.function()(args);
      return TypeError(absl::StrCat("'", callee.name, "' is not callable"));
    }
    TANDEM_ASSIGN_OR_RETURN(Value fn, Eval(callee));
    if (!fn.is_callable()) {
      return TypeError(callee.kind == Expr::Kind::kName
                           ? absl::StrCat("'", callee.name, "' is not callable")
                           : std::string("object is not callable"));
    }
    return fn.function()(args);
  }

  // loop(items) in the body of a recursive loop: the loop again over `items`, one level deeper,
  // rendered to a string.
  absl::StatusOr<Value> RecurseLoop(CallArgs& args) {
    const ActiveLoop active = loops_.back();
    if (!active.node->recursive) return TypeError("loop() called in a loop that is not recursive");
    if (args.positional.size() != 1) return TypeError("loop() takes one sequence");
    if (call_depth_ >= limits_.max_call_depth) return TypeError("loops recursed too deeply");
    ++call_depth_;
    const int saved_loops = loop_depth_;
    std::string rendered;
    absl::StatusOr<Flow> flow =
        ExecFor(*active.node, &rendered, &args.positional[0], active.depth + 1);
    loop_depth_ = saved_loops;
    --call_depth_;
    if (!flow.ok()) return flow.status();
    return Value(Json(std::move(rendered)));
  }

  struct ActiveLoop {
    const Node* node;
    int64_t depth;  // loop.depth: 1, deeper in each loop(items)
  };

  const RenderLimits& limits_;
  Budget budget_;
  std::vector<ActiveLoop> loops_;  // the for loops running, innermost last
  std::vector<Scope> scopes_;
  int loop_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Body& body, const Json& variables,
                                   const RenderLimits& limits) {
  CallableTable callables;  // before the evaluator: its globals are callables too
  Evaluator evaluator(limits);
  return evaluator.Run(body, variables);
}

}  // namespace tandem::chat_template
