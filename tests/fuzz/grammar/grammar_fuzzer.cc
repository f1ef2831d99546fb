// Fuzzes the constraint front ends and the matcher: byte 0 picks grammar text, JSON Schema or
// regex, the rest is the constraint. Whatever compiles is then driven: a walk over a byte
// vocabulary taking allowed tokens (checked: every allowed token is accepted, rollback restores
// the mask). Malformed input must give a status, never a crash, hang or unbounded memory; the
// compilation runs under the served CPU budget.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "common/grammar/matcher.h"

namespace {

std::shared_ptr<const tandem::grammar::TokenVocab> Vocab() {
  static auto* vocab = new std::shared_ptr<const tandem::grammar::TokenVocab>([] {
    std::vector<std::string> bytes;
    for (int c = 0; c < 256; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
    for (const char* t : {"{\"", "\":", "\",\"", "true", "null", "ab", "\xC3\xA9"})
      bytes.push_back(t);
    return tandem::grammar::TokenVocab::FromBytes(bytes);
  }());
  return *vocab;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::grammar::Constraint;
  if (size < 1 || size > 4096) return 0;
  Constraint c;
  switch (data[0] % 3) {
    case 0:
      c.kind = Constraint::Kind::kGrammar;
      break;
    case 1:
      c.kind = Constraint::Kind::kJsonSchema;
      break;
    default:
      c.kind = Constraint::Kind::kRegex;
      break;
  }
  c.strict = (data[0] & 4) == 0;
  c.value.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  tandem::grammar::GrammarLimits limits;
  limits.max_symbols = 200000;
  tandem::grammar::GrammarCompiler compiler(Vocab(), 4, limits);
  // As served: a compilation (first mask included) stops at its CPU budget.
  tandem::grammar::CompileBudget budget(/*cpu_ms=*/2000);
  auto compiled = compiler.Compile(c, &budget);
  if (!compiled.ok()) return 0;
  tandem::grammar::GrammarMatcher m(*compiled);
  uint32_t pick = 0x9e3779b9u;
  for (int step = 0; step < 24 && !m.IsTerminated(); ++step) {
    auto mask = m.NextTokenMask();
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < Vocab()->size(); ++id) {
      if (((*mask)[id >> 6] >> (id & 63)) & 1) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    pick = pick * 1664525u + 1013904223u;
    if (!m.AcceptToken(allowed[pick % allowed.size()])) __builtin_trap();
    if (step % 5 == 4) {
      m.Rollback(1);
      if (*m.NextTokenMask() != *mask) __builtin_trap();
      m.AcceptToken(allowed[pick % allowed.size()]);
    }
  }
  return 0;
}
