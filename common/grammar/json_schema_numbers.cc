#include "common/grammar/json_schema_numbers.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::grammar {
namespace {

constexpr uint64_t kMaxMagnitude = 9999999999999999ull;  // 16 digits, as json-nonneg-int

std::string Digits(char a, char b) {
  if (a == b) return absl::StrCat("\"", std::string(1, a), "\"");
  return absl::StrCat("[", std::string(1, a), "-", std::string(1, b), "]");
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  return n == 1 ? "[0-9]" : absl::StrCat("[0-9]{", n, "}");
}

// Strings of equal length between a and b (digit strings, a <= b), digit by digit.
std::string SameLength(const std::string& a, const std::string& b) {
  if (a.empty()) return "\"\"";
  const size_t rest = a.size() - 1;
  const std::string ta = a.substr(1), tb = b.substr(1);
  if (a[0] == b[0]) {
    if (rest == 0) return Digits(a[0], a[0]);
    return absl::StrCat(Digits(a[0], a[0]), " ", SameLength(ta, tb));
  }
  const bool low_full = ta.find_first_not_of('0') == std::string::npos;
  const bool high_full = tb.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  char mid_lo = a[0] + 1, mid_hi = b[0] - 1;
  if (low_full) {
    mid_lo = a[0];
  } else {
    alts.push_back(
        absl::StrCat(Digits(a[0], a[0]), " ( ", SameLength(ta, std::string(rest, '9')), " )"));
  }
  if (high_full) mid_hi = b[0];
  if (mid_lo <= mid_hi) {
    alts.push_back(rest == 0 ? Digits(mid_lo, mid_hi)
                             : absl::StrCat(Digits(mid_lo, mid_hi), " ", AnyDigits(rest)));
  }
  if (!high_full) {
    alts.push_back(
        absl::StrCat(Digits(b[0], b[0]), " ( ", SameLength(std::string(rest, '0'), tb), " )"));
  }
  return alts.size() == 1 ? alts[0] : absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
}

// Non-negative integers in [lo, hi] without leading zeros.
std::string Magnitudes(uint64_t lo, uint64_t hi) {
  hi = std::min(hi, kMaxMagnitude);
  if (lo > hi) return "";
  std::vector<std::string> alts;
  const std::string a = std::to_string(lo), b = std::to_string(hi);
  for (size_t len = a.size(); len <= b.size(); ++len) {
    const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string to = len == b.size() ? b : std::string(len, '9');
    if (from == "1" + std::string(len - 1, '0') && to == std::string(len, '9') && len > 1) {
      alts.push_back(absl::StrCat("[1-9] ", AnyDigits(len - 1)));
    } else {
      alts.push_back(SameLength(from, to));
    }
  }
  return alts.size() == 1 ? alts[0] : absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
}

uint64_t Abs(int64_t v) { return v < 0 ? 0 - static_cast<uint64_t>(v) : v; }

std::string Join(const std::vector<std::string>& alts) {
  std::vector<std::string> kept;
  for (const auto& a : alts)
    if (!a.empty()) kept.push_back(a);
  if (kept.empty()) return "";
  return kept.size() == 1 ? kept[0] : absl::StrCat("( ", absl::StrJoin(kept, " | "), " )");
}

constexpr char kFraction[] = "( \".\" [0-9]{1,16} )?";
constexpr char kZeros[] = "( \".\" \"0\"{1,16} )?";

}  // namespace

std::string IntegerRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return "";
  std::vector<std::string> alts;
  // Negative part: -m for m in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t mlo = hi && *hi < 0 ? Abs(*hi) : 1;
    const uint64_t mhi = lo ? Abs(*lo) : kMaxMagnitude;
    if (std::string m = Magnitudes(mlo, mhi); !m.empty()) alts.push_back("\"-\" " + m);
  }
  // Non-negative part.
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? *lo : 0;
    const uint64_t to = hi ? *hi : kMaxMagnitude;
    alts.push_back(Magnitudes(from, to));
  }
  return Join(alts);
}

std::string NumberRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return "";
  std::vector<std::string> alts;
  // Non-negative x = i + f: i in [max(lo, 0), hi - 1] with any fraction, or i == hi with zeros.
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? *lo : 0;
    if (!hi) {
      alts.push_back(absl::StrCat(Magnitudes(from, kMaxMagnitude), " ", kFraction));
    } else {
      if (*hi > 0 && from <= static_cast<uint64_t>(*hi - 1)) {
        alts.push_back(absl::StrCat(Magnitudes(from, *hi - 1), " ", kFraction));
      }
      alts.push_back(absl::StrCat(Magnitudes(*hi, *hi), " ", kZeros));
    }
  }
  // Negative x = -(i + f), i + f in [max(-hi, 0), -lo]: i in [max(-hi, 0), -lo - 1] with any
  // fraction, or i == -lo with zeros. "-0" forms are allowed only when 0 is in range.
  if (!lo || *lo < 0) {
    const uint64_t from = hi && *hi < 0 ? Abs(*hi) : 0;
    std::vector<std::string> neg;
    if (!lo) {
      neg.push_back(
          absl::StrCat(Magnitudes(std::max<uint64_t>(from, 1), kMaxMagnitude), " ", kFraction));
      if (from == 0) neg.push_back("\"0\" \".\" [0-9]{1,16}");
    } else {
      const uint64_t top = Abs(*lo);
      if (from <= top - 1) {
        if (from == 0) {
          // -0.x: a fraction (a bare "-0" also equals 0, in range here).
          neg.push_back(absl::StrCat("\"0\" ", kFraction));
          if (top - 1 >= 1) neg.push_back(absl::StrCat(Magnitudes(1, top - 1), " ", kFraction));
        } else {
          neg.push_back(absl::StrCat(Magnitudes(from, top - 1), " ", kFraction));
        }
      }
      neg.push_back(absl::StrCat(Magnitudes(top, top), " ", kZeros));
    }
    if (std::string n = Join(neg); !n.empty()) alts.push_back("\"-\" " + n);
  }
  return Join(alts);
}

int TenthPower(double v) {
  double p = 1;
  for (int k = 1; k <= 16; ++k) {
    p /= 10;
    if (std::abs(v - p) <= p * 1e-9) return k;
  }
  return 0;
}
std::string MultiplesExpr(int64_t m,
                          const std::function<std::string(const std::string&)>& new_rule) {
  std::map<std::pair<int64_t, int>, std::string> names;
  for (int k = 16; k >= 1; --k) {
    for (int64_t r = 0; r < m; ++r) {
      std::vector<std::string> alts;
      if (r == 0) alts.push_back("\"\"");
      if (k < 16) {
        std::map<int64_t, std::string> by_target;  // next remainder -> digits
        for (int d = 0; d <= 9; ++d) by_target[(10 * r + d) % m] += static_cast<char>('0' + d);
        for (const auto& [t, digits] : by_target) {
          auto next = names.find({t, k + 1});
          if (next != names.end()) alts.push_back(absl::StrCat("[", digits, "] ", next->second));
        }
      }
      if (alts.empty()) continue;
      names[{r, k}] = new_rule(absl::StrJoin(alts, " | "));
    }
  }
  // Leading digit 1..9, then the automaton; "0"; negatives.
  std::map<int64_t, std::string> first;
  for (int d = 1; d <= 9; ++d) first[d % m] += static_cast<char>('0' + d);
  std::vector<std::string> starts;
  for (const auto& [t, digits] : first) {
    auto next = names.find({t, 1});
    if (next != names.end()) starts.push_back(absl::StrCat("[", digits, "] ", next->second));
  }
  const std::string positive = new_rule(absl::StrJoin(starts, " | "));
  return absl::StrCat("\"0\" | \"-\"? ", positive);
}
}  // namespace tandem::grammar
