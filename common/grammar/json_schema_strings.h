#pragma once

// String grammars of the JSON Schema front end (json_schema.cc): formats, and object keys that
// avoid declared names.

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace tandem::grammar {

// The grammar expression (between the quotes) of a string `format`: date, time, date-time,
// uuid, ipv4, email, hostname, each a subset of what format validators accept (days per month,
// never February 29; bounded fractions, atoms and labels). nullopt for other formats.
std::optional<std::string> FormatExpr(std::string_view format);

// The grammar of an object key (quotes included) that is any JSON string except the names in
// `excluded`, so a key made for additionalProperties never repeats a declared one. Keys are
// spelled one way only (no \u or \/ escapes) so excluding a spelling excludes the name. A trie
// over the names' characters, each node a rule added through `new_rule` (which returns its
// name): end here (unless a name ends here), a character no name continues with and then
// anything, or a name's next character. "json-string" when `excluded` is empty.
std::string ExtraKeyGrammar(const std::set<std::string>& excluded,
                            const std::function<std::string(const std::string&)>& new_rule);

}  // namespace tandem::grammar
