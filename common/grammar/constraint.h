#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::grammar {

// What a request's output must match. Part of SamplingParams; compiled by GrammarCompiler.
struct Constraint {
  enum class Kind {
    kNone = 0,
    kJsonObject,  // any JSON object
    kJsonSchema,  // value: a JSON Schema (text)
    kRegex,       // value: a regular expression
    kGrammar,     // value: a grammar in the text form (README.md)
    kChoice,      // choices: exactly one of these strings
  };
  Kind kind = Kind::kNone;
  std::string value;
  std::vector<std::string> choices;
  // JSON Schema: strict refuses unsupported keywords (INVALID_ARGUMENT); not strict ignores
  // them (the output still follows every supported keyword).
  bool strict = true;

  bool active() const { return kind != Kind::kNone; }
  bool operator==(const Constraint& o) const {
    return kind == o.kind && value == o.value && choices == o.choices && strict == o.strict;
  }
};

const char* ConstraintKindName(Constraint::Kind kind);

}  // namespace tandem::grammar
