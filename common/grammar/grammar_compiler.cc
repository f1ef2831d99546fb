#include "common/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/regex_to_grammar.h"

namespace tandem::grammar {

const char* ConstraintKindName(Constraint::Kind kind) {
  switch (kind) {
    case Constraint::Kind::kNone:
      return "none";
    case Constraint::Kind::kJsonObject:
      return "json_object";
    case Constraint::Kind::kJsonSchema:
      return "json_schema";
    case Constraint::Kind::kRegex:
      return "regex";
    case Constraint::Kind::kGrammar:
      return "grammar";
    case Constraint::Kind::kChoice:
      return "choice";
  }
  return "?";
}

absl::StatusOr<std::string> ConstraintToGrammarText(const Constraint& c) {
  switch (c.kind) {
    case Constraint::Kind::kNone:
      return absl::InvalidArgumentError("constraint: none given");
    case Constraint::Kind::kJsonObject:
      return AnyJsonGrammar(/*object_only=*/true);
    case Constraint::Kind::kJsonSchema: {
      JsonSchemaOptions options;
      options.strict = c.strict;
      return JsonSchemaToGrammar(c.value, options);
    }
    case Constraint::Kind::kRegex: {
      auto expr = RegexToGrammarExpr(c.value);
      if (!expr.ok()) return expr.status();
      return absl::StrCat("root ::= ", *expr, "\n");
    }
    case Constraint::Kind::kGrammar:
      return c.value;
    case Constraint::Kind::kChoice: {
      if (c.choices.empty()) return absl::InvalidArgumentError("choice: needs at least one string");
      std::string out = "root ::= ";
      for (size_t i = 0; i < c.choices.size(); ++i) {
        absl::StrAppend(&out, i ? " | " : "", GrammarLiteral(c.choices[i]));
      }
      return absl::StrCat(out, "\n");
    }
  }
  return absl::InvalidArgumentError("constraint: unknown kind");
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocab> vocab, size_t max_entries,
                                 GrammarLimits limits, CompiledGrammarOptions options)
    : vocab_(std::move(vocab)), max_entries_(max_entries), limits_(limits), options_(options) {}

namespace {

bool Exhausted(const CompiledGrammar& g) {
  std::lock_guard<std::mutex> lock(g.graph().mu());
  return g.graph().exhausted();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const Constraint& c) {
  std::string key =
      absl::StrCat(static_cast<int>(c.kind), c.strict ? "s" : "n", c.value.size(), ":", c.value);
  for (const std::string& choice : c.choices)
    absl::StrAppend(&key, "\x1f", choice.size(), ":", choice);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end() && Exhausted(*it->second.first)) {
      lru_.erase(it->second.second);
      cache_.erase(it);
    } else if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      ++hits_;
      return it->second.first;
    }
  }
  auto text = ConstraintToGrammarText(c);
  if (!text.ok()) return text.status();
  auto grammar = ParseGrammar(*text, limits_);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*grammar), vocab_, options_);
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.count(key) == 0) {
    lru_.push_front(key);
    cache_[key] = {compiled, lru_.begin()};
    while (cache_.size() > max_entries_) {
      cache_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  return compiled;
}

int64_t GrammarCompiler::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace tandem::grammar
