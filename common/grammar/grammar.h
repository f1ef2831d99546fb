#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/compile_budget.h"

namespace tandem::grammar {

// A set of bytes one terminal position accepts.
using ByteSet = std::bitset<256>;

// Bounds that keep a hostile grammar from exhausting memory or time: compiling refuses a
// grammar past them with INVALID_ARGUMENT instead.
struct GrammarLimits {
  int32_t max_rules = 100000;
  int32_t max_symbols = 2000000;  // symbols over all productions, after expanding repetitions
  int32_t max_repeat = 1000;      // m and n of x{m,n}
  int32_t max_depth = 200;        // nesting of groups in the text form
};

// A context-free grammar over bytes (the compiled form of the text form in README.md).
// Symbols: >= 0 is a rule id; < 0 is terminal ~symbol (an index into `terminals`). Repetition and
// optional parts are already expanded into helper rules (left-recursive for loops).
struct Grammar {
  struct Production {
    int32_t lhs = 0;
    int32_t begin = 0;  // into `symbols`
    int32_t end = 0;
  };
  std::vector<ByteSet> terminals;
  std::vector<Production> productions;
  std::vector<int32_t> symbols;
  std::vector<std::vector<int32_t>> rule_productions;  // rule -> its production ids
  std::vector<std::string> rule_names;
  std::vector<bool> nullable;  // rule derives the empty string
  int32_t root = 0;

  int32_t num_rules() const { return static_cast<int32_t>(rule_names.size()); }
  int32_t SymbolAt(int32_t production, int32_t dot) const {
    return symbols[productions[production].begin + dot];
  }
  int32_t Length(int32_t production) const {
    return productions[production].end - productions[production].begin;
  }
};

// Builds a Grammar: rules, productions, interned byte-set terminals, UTF-8 code point ranges.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarLimits& limits = {}) : limits_(limits) {}

  // The id of the rule `name`, created (without productions) when new.
  absl::StatusOr<int32_t> Rule(std::string_view name);
  // A fresh helper rule named after `base`.
  absl::StatusOr<int32_t> NewRule(std::string_view base);
  absl::Status AddProduction(int32_t rule, const std::vector<int32_t>& symbols);
  // The terminal symbol (negative) for a byte set.
  int32_t Terminal(const ByteSet& bytes);
  // Symbols matching exactly the bytes of `literal`.
  std::vector<int32_t> Literal(std::string_view literal);
  // A symbol matching one UTF-8 encoded code point in `ranges` (inclusive pairs); negated: any
  // code point outside them (surrogates are never matched).
  absl::StatusOr<int32_t> CodePointClass(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                         bool negated);
  const GrammarLimits& limits() const { return limits_; }
  // Checked by Finish once per production analysed (not owned; null: unlimited).
  void set_budget(CompileBudget* budget) { budget_ = budget; }

  // Checks that every referenced rule has a production and computes nullability (linear in the
  // grammar's size: worklists, whatever order the rules come in).
  absl::StatusOr<Grammar> Finish(int32_t root);

 private:
  // Marks every rule derived by a fixpoint over productions: a production holds once each of its
  // symbols holds (`terminal_holds` for terminals; rules once marked).
  absl::Status Propagate(const std::function<bool(const ByteSet&)>& terminal_holds,
                         std::vector<bool>* marked);

  GrammarLimits limits_;
  CompileBudget* budget_ = nullptr;
  Grammar g_;
  absl::flat_hash_map<std::string, int32_t> rules_;
  absl::flat_hash_map<std::string, int32_t> terminal_ids_;  // ByteSet bits -> terminal
  int32_t helper_count_ = 0;
};

}  // namespace tandem::grammar
