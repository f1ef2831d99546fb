#pragma once

// Grammar expressions for JSON numbers within bounds (the JSON Schema front end's minimum,
// maximum and exclusive bounds). Integers are exact for any int64 bounds; numbers with a
// fraction are exact for integral inclusive bounds. Numbers carry at most 16 integer digits
// (json_schema.cc's base rules), so an unbounded side stops at 16 digits.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tandem::grammar {

// The decimal integers in [lo, hi] (either side may be open), as a grammar expression over
// compact JSON (no leading zeros, "-" sign, never "-0"). Empty string when the range is empty.
std::string IntegerRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi);

// JSON numbers x with lo <= x <= hi (integral bounds, either side open): an integer part in range
// followed by any fraction, or a bound itself followed only by zeros. No exponent. Empty string
// when the range is empty.
std::string NumberRangeExpr(std::optional<int64_t> lo, std::optional<int64_t> hi);

// k when v is 10^-k (k in 1..16), else 0.
int TenthPower(double v);

// The integers that are multiples of m (2..1000) as a grammar expression: a remainder automaton
// over at most 16 digits (as the base rules), states (remainder, digits so far), each a rule
// added through `new_rule` (which returns its name).
std::string MultiplesExpr(int64_t m,
                          const std::function<std::string(const std::string&)>& new_rule);

}  // namespace tandem::grammar
