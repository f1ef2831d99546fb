#include "common/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
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

namespace {

GrammarCompilerOptions CountBounded(size_t max_entries, GrammarLimits limits,
                                    CompiledGrammarOptions grammar) {
  GrammarCompilerOptions options;
  options.max_entries = static_cast<int64_t>(max_entries);
  options.limits = limits;
  options.grammar = grammar;
  return options;
}

}  // namespace

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocab> vocab,
                                 GrammarCompilerOptions options)
    : vocab_(std::move(vocab)),
      options_(std::move(options)),
      memory_(std::make_shared<GrammarMemory>(options_.max_bytes, options_.max_entries)) {}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocab> vocab, size_t max_entries,
                                 GrammarLimits limits, CompiledGrammarOptions options)
    : GrammarCompiler(std::move(vocab), CountBounded(max_entries, limits, options)) {}

// Grammars sequences still hold keep the memory account alive; the cache's own references go
// now (they hold the account: without this the two would keep each other alive).
GrammarCompiler::~GrammarCompiler() { memory_->Clear(); }

std::string GrammarCompiler::CacheKey(const Constraint& c) {
  std::string key =
      absl::StrCat(static_cast<int>(c.kind), c.strict ? "s" : "n", c.value.size(), ":", c.value);
  for (const std::string& choice : c.choices)
    absl::StrAppend(&key, "\x1f", choice.size(), ":", choice);
  return key;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::Lookup(const std::string& key) {
  return memory_->Find(key);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const Constraint& c, CompileBudget* budget) {
  const std::string key = CacheKey(c);
  if (auto hit = memory_->Find(key)) return hit;
  absl::StatusOr<std::string> text;
  if (c.kind == Constraint::Kind::kJsonSchema) {
    JsonSchemaOptions options;
    options.strict = c.strict;
    options.budget = budget;
    text = JsonSchemaToGrammar(c.value, options);
  } else {
    text = ConstraintToGrammarText(c);
  }
  if (!text.ok()) return text.status();
  auto grammar = ParseGrammar(*text, options_.limits, budget);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*grammar), vocab_,
                                                          options_.grammar, memory_);
  if (options_.warm_first_mask) {
    GrammarMatcher matcher(compiled);
    const double before_ms = budget != nullptr ? budget->cpu_ms_used() : 0;
    auto mask = matcher.NextTokenMaskWithin(budget);
    if (!mask.ok()) return mask.status();
    if (budget != nullptr) {
      compiled->NoteMaskCost(static_cast<int64_t>((budget->cpu_ms_used() - before_ms) * 1000));
    }
  }
  if (budget != nullptr) {
    if (auto st = budget->Check(); !st.ok()) return st;
  }
  memory_->Insert(key, compiled);
  return compiled;
}

int64_t GrammarCompiler::hits() const { return memory_->stats().hits; }

}  // namespace tandem::grammar
