#include "common/grammar/grammar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;  // one per byte of a sequence

int Utf8Encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

// Splits the code point range [lo, hi] into byte-range sequences whose cross product is exactly
// the UTF-8 encodings of the range (the classic utf8-ranges construction).
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  if (lo > hi) return;
  static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t m : kMax) {
    if (lo <= m && hi > m) {
      SplitUtf8(lo, m, out);
      SplitUtf8(m + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = Utf8Encode(lo, a);
  Utf8Encode(hi, b);
  ByteRanges seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

std::string Key(const ByteSet& bytes) { return bytes.to_string(); }

}  // namespace

absl::StatusOr<int32_t> GrammarBuilder::Rule(std::string_view name) {
  auto it = rules_.find(std::string(name));
  if (it != rules_.end()) return it->second;
  if (g_.num_rules() >= limits_.max_rules) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: more than ", limits_.max_rules, " rules"));
  }
  const int32_t id = g_.num_rules();
  g_.rule_names.emplace_back(name);
  g_.rule_productions.emplace_back();
  rules_.emplace(std::string(name), id);
  return id;
}

absl::StatusOr<int32_t> GrammarBuilder::NewRule(std::string_view base) {
  return Rule(absl::StrCat(std::string(base), "#", helper_count_++));
}

absl::Status GrammarBuilder::AddProduction(int32_t rule, const std::vector<int32_t>& symbols) {
  if (static_cast<int64_t>(g_.symbols.size()) + static_cast<int64_t>(symbols.size()) >
      limits_.max_symbols) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: more than ", limits_.max_symbols, " symbols (too large)"));
  }
  Grammar::Production p;
  p.lhs = rule;
  p.begin = static_cast<int32_t>(g_.symbols.size());
  g_.symbols.insert(g_.symbols.end(), symbols.begin(), symbols.end());
  p.end = static_cast<int32_t>(g_.symbols.size());
  g_.rule_productions[rule].push_back(static_cast<int32_t>(g_.productions.size()));
  g_.productions.push_back(p);
  return absl::OkStatus();
}

int32_t GrammarBuilder::Terminal(const ByteSet& bytes) {
  auto [it, inserted] =
      terminal_ids_.emplace(Key(bytes), static_cast<int32_t>(g_.terminals.size()));
  if (inserted) g_.terminals.push_back(bytes);
  return ~it->second;
}

std::vector<int32_t> GrammarBuilder::Literal(std::string_view literal) {
  std::vector<int32_t> out;
  out.reserve(literal.size());
  for (unsigned char c : literal) {
    ByteSet b;
    b.set(c);
    out.push_back(Terminal(b));
  }
  return out;
}

absl::StatusOr<int32_t> GrammarBuilder::CodePointClass(
    std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.push_back({lo, hi});
    }
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> complement;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) complement.push_back({next, lo - 1});
      next = hi + 1;
    }
    if (next <= 0x10FFFF) complement.push_back({next, 0x10FFFF});
    merged = std::move(complement);
  }
  // Surrogates are not code points UTF-8 may encode.
  std::vector<std::pair<uint32_t, uint32_t>> valid;
  for (auto [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      valid.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) valid.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) valid.push_back({0xE000, hi});
  }
  std::vector<ByteRanges> seqs;
  for (auto [lo, hi] : valid) SplitUtf8(lo, hi, &seqs);
  ByteSet single;
  std::vector<ByteRanges> multi;
  for (auto& s : seqs) {
    if (s.size() == 1) {
      for (int c = s[0].first; c <= s[0].second; ++c) single.set(c);
    } else {
      multi.push_back(std::move(s));
    }
  }
  if (multi.empty() && single.any()) return Terminal(single);
  auto rule = NewRule("class");
  if (!rule.ok()) return rule.status();
  if (single.any()) {
    if (auto st = AddProduction(*rule, {Terminal(single)}); !st.ok()) return st;
  }
  for (const ByteRanges& s : multi) {
    std::vector<int32_t> syms;
    for (auto [lo, hi] : s) {
      ByteSet b;
      for (int c = lo; c <= hi; ++c) b.set(c);
      syms.push_back(Terminal(b));
    }
    if (auto st = AddProduction(*rule, syms); !st.ok()) return st;
  }
  return *rule;  // no production at all when the class is empty: it never matches
}

absl::Status GrammarBuilder::Propagate(const std::function<bool(const ByteSet&)>& terminal_holds,
                                       std::vector<bool>* marked) {
  // missing[p]: symbols of production p that do not hold yet (a terminal that never holds counts
  // forever); uses[r]: the productions naming rule r, once per occurrence (CSR arrays).
  const size_t num_prods = g_.productions.size();
  std::vector<int32_t> missing(num_prods, 0);
  std::vector<int32_t> use_begin(g_.num_rules() + 1, 0);
  for (int32_t s : g_.symbols) {
    if (s >= 0) ++use_begin[s + 1];
  }
  for (int32_t r = 0; r < g_.num_rules(); ++r) use_begin[r + 1] += use_begin[r];
  std::vector<int32_t> uses(use_begin.back());
  std::vector<int32_t> fill(use_begin.begin(), use_begin.end() - 1);
  std::vector<int32_t> ready;
  for (size_t p = 0; p < num_prods; ++p) {
    if (budget_ != nullptr) {
      if (auto st = budget_->Check(); !st.ok()) return st;
    }
    const Grammar::Production& prod = g_.productions[p];
    for (int32_t i = prod.begin; i < prod.end; ++i) {
      const int32_t s = g_.symbols[i];
      if (s >= 0) {
        uses[fill[s]++] = static_cast<int32_t>(p);
        ++missing[p];
      } else if (!terminal_holds(g_.terminals[~s])) {
        ++missing[p];
      }
    }
    if (missing[p] == 0) ready.push_back(static_cast<int32_t>(p));
  }
  while (!ready.empty()) {
    if (budget_ != nullptr) {
      if (auto st = budget_->Check(); !st.ok()) return st;
    }
    const int32_t lhs = g_.productions[ready.back()].lhs;
    ready.pop_back();
    if ((*marked)[lhs]) continue;
    (*marked)[lhs] = true;
    for (int32_t u = use_begin[lhs]; u < use_begin[lhs + 1]; ++u) {
      if (--missing[uses[u]] == 0) ready.push_back(uses[u]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Grammar> GrammarBuilder::Finish(int32_t root) {
  // Rules referenced but never defined are errors; an empty class rule (helper) simply never
  // matches.
  std::vector<bool> referenced(g_.num_rules(), false);
  for (int32_t s : g_.symbols) {
    if (s >= 0) referenced[s] = true;
  }
  for (int32_t r = 0; r < g_.num_rules(); ++r) {
    if (referenced[r] && g_.rule_productions[r].empty() &&
        g_.rule_names[r].find('#') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: rule '", g_.rule_names[r], "' is used but never defined"));
    }
  }
  if (root < 0 || root >= g_.num_rules() || g_.rule_productions[root].empty()) {
    return absl::InvalidArgumentError("grammar: the root rule has no definition");
  }
  g_.nullable.assign(g_.num_rules(), false);
  if (auto st = Propagate([](const ByteSet&) { return false; }, &g_.nullable); !st.ok()) {
    return st;
  }
  // The root must derive some byte string, or every output would be refused.
  std::vector<bool> productive(g_.num_rules(), false);
  if (auto st = Propagate([](const ByteSet& b) { return b.any(); }, &productive); !st.ok()) {
    return st;
  }
  if (!productive[root]) {
    return absl::InvalidArgumentError(
        "grammar: the root rule matches no string (endless recursion)");
  }
  // Drop productions that can never complete, so that every Earley item stands for a prefix
  // some sentence extends: a non-empty item set means "viable prefix".
  Grammar pruned = g_;
  pruned.productions.clear();
  pruned.symbols.clear();
  for (auto& prods : pruned.rule_productions) prods.clear();
  for (const auto& p : g_.productions) {
    if (budget_ != nullptr) {
      if (auto st = budget_->Check(); !st.ok()) return st;
    }
    bool ok = true;
    for (int32_t i = p.begin; i < p.end && ok; ++i) {
      const int32_t s = g_.symbols[i];
      ok = s < 0 ? g_.terminals[~s].any() : static_cast<bool>(productive[s]);
    }
    if (!ok) continue;
    Grammar::Production q;
    q.lhs = p.lhs;
    q.begin = static_cast<int32_t>(pruned.symbols.size());
    pruned.symbols.insert(pruned.symbols.end(), g_.symbols.begin() + p.begin,
                          g_.symbols.begin() + p.end);
    q.end = static_cast<int32_t>(pruned.symbols.size());
    pruned.rule_productions[p.lhs].push_back(static_cast<int32_t>(pruned.productions.size()));
    pruned.productions.push_back(q);
  }
  pruned.root = root;
  return pruned;
}

}  // namespace tandem::grammar
