// Fuzzes the JSON Schema front end alone (faster and deeper than grammar_fuzzer's share of it):
// byte 0 picks strict or not, the rest is the schema text. Whatever compiles must be a grammar
// the parser accepts within the default bounds, or be refused by them; a malformed schema,
// recursion bomb ($ref cycles through allOf, nesting) or enormous enum must give a status, never
// a crash, a hang or unbounded memory. Seeds (corpus/json_schema_fuzzer): schemas of every
// supported keyword from tests/e2e/structured_output/schemas.jsonl and hostile shapes.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 8192) return 0;
  tandem::grammar::JsonSchemaOptions options;
  options.strict = (data[0] & 1) == 0;
  const std::string schema(reinterpret_cast<const char*>(data + 1), size - 1);
  auto text = tandem::grammar::JsonSchemaToGrammar(schema, options);
  if (!text.ok()) {
    if (text.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  tandem::grammar::GrammarLimits limits;
  limits.max_symbols = 200000;
  auto grammar = tandem::grammar::ParseGrammar(*text, limits);
  // The compiler's output is always well-formed text: only bounds or an empty language may
  // refuse it.
  if (!grammar.ok() && grammar.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
