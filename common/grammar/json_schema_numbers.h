#pragma once

// Grammar expressions for JSON numbers within bounds (the JSON Schema front end's minimum,
// maximum and exclusive bounds). Integers are exact for any int64 bounds; numbers with a
// fraction are exact for integral inclusive bounds. Numbers carry at most 16 integer digits
// (json_schema.cc's base rules), so an unbounded side stops at 16 digits.

#include <cstdint>
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

}  // namespace tandem::grammar
