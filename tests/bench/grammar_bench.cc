// Structured-output costs, side by side in one run (docs/benchmarks.md):
//  1. schema compile time (JSON Schema -> grammar -> compiled) over a corpus: median and p99;
//  2. mask time per generated token on real tokenizers (cache hits and misses together);
//  3. engine decode tokens/s with a JSON-schema constraint versus none, batch 1 and 16.
// Usage: grammar_bench [--masks] [model_dir] [json-schema-test-suite tests dir]
//   (--masks: parts 1 and 2 only)
//        grammar_bench --decode model_dir [rounds] [max_tokens] [temperature (0: greedy)]
//   (only part 3 with one engine, the realistic nested schema, none and json alternating for
//   `rounds` rounds at batch 1 and 16, medians; then the mask time per token replaying the
//   constrained outputs through a cold mask cache)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_parser.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/grammar/reference/reference_paths.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

const char kSchema[] = R"({"type":"object","properties":{"name":{"type":"string","maxLength":16},
  "age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"string"},"maxItems":4},
  "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string",
  "pattern":"^[0-9]{5}$"}},"required":["city"]}},"required":["name","age"]})";

std::vector<std::string> Corpus(const std::string& suite) {
  std::vector<std::string> out = {kSchema};
  if (!std::filesystem::exists(suite)) return out;
  for (const char* draft : {"draft4", "draft6", "draft7"}) {
    for (const auto& f : std::filesystem::directory_iterator(suite + "/" + draft)) {
      if (f.path().extension() != ".json") continue;
      std::ifstream in(f.path());
      auto groups = nlohmann::json::parse(in, nullptr, false);
      if (!groups.is_array()) continue;
      for (const auto& g : groups) out.push_back(g["schema"].dump());
    }
  }
  return out;
}

void CompileTimes(const std::string& suite,
                  std::shared_ptr<const tandem::grammar::TokenVocab> vocab) {
  std::vector<double> ms;
  int refused = 0;
  for (const std::string& schema : Corpus(suite)) {
    tandem::grammar::GrammarCompiler compiler(vocab);  // no cache across schemas
    tandem::grammar::Constraint c;
    c.kind = tandem::grammar::Constraint::Kind::kJsonSchema;
    c.value = schema;
    auto t0 = Clock::now();
    auto g = compiler.Compile(c);
    auto t1 = Clock::now();
    if (!g.ok()) {
      ++refused;
      continue;
    }
    tandem::grammar::GrammarMatcher m(*g);
    m.NextTokenMask();  // the first mask is part of getting started
    ms.push_back(Ms(Clock::now() - t0));
    (void)t1;
  }
  std::sort(ms.begin(), ms.end());
  if (ms.empty()) return;
  std::printf("compile (+ first mask), %zu schemas (%d refused): median %.3f ms, p99 %.3f ms\n",
              ms.size(), refused, ms[ms.size() / 2],
              ms[std::min(ms.size() - 1, ms.size() * 99 / 100)]);
}

// Token sequences of `docs` random documents under `g` (uniform over the allowed tokens).
std::vector<std::vector<int32_t>> RandomDocuments(
    std::shared_ptr<const tandem::grammar::CompiledGrammar> g, int docs, int max_tokens) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> out;
  for (int doc = 0; doc < docs; ++doc) {
    tandem::grammar::GrammarMatcher m(g);
    std::vector<int32_t> tokens;
    for (int step = 0; step < max_tokens && !m.IsTerminated(); ++step) {
      auto mask = m.NextTokenMask();
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < g->vocab().size(); ++id) {
        if (((*mask)[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
      }
      if (ids.empty()) break;
      tokens.push_back(ids[rng() % ids.size()]);
      m.AcceptToken(tokens.back());
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

// Mask cost per token replaying `docs` under a freshly compiled `grammar_text`, side by side:
//  - before: the trie walk from every state seen for the first time (a per-state cache after),
//    on the earlier state graph that kept complete items;
//  - compact graph: the same walk on the graph without complete items;
//  - cold: what serving a new grammar costs now (NextTokenMask): a direct walk for a position's
//    first state, position sets plus the context check for the next ones, per-state cache;
//  - known position: a state whose position's sets exist (the context check only);
//  - warm: every state cached.
// Reports the mean per token and per cache miss (first sight of a state), in microseconds.
void MaskCosts(const std::string& label, const std::string& grammar_text,
               std::shared_ptr<const tandem::grammar::TokenVocab> vocab,
               const std::vector<std::vector<int32_t>>& docs) {
  using tandem::grammar::CompiledGrammar;
  using tandem::grammar::GrammarMatcher;
  auto fresh = [&](bool keep_complete_items) -> std::shared_ptr<const CompiledGrammar> {
    auto grammar = *tandem::grammar::ParseGrammar(grammar_text);
    if (keep_complete_items) {
      return tandem::grammar::ReferencePaths::WithCompleteItems(std::move(grammar), vocab);
    }
    return std::make_shared<const CompiledGrammar>(std::move(grammar), vocab);
  };
  struct Cost {
    double total_ms = 0, miss_ms = 0;
    int64_t tokens = 0, misses = 0;
  };
  // mode 0: before (walk on first sight), 1: cold positions, 2: known positions, 3: warm.
  auto replay = [&](std::shared_ptr<const CompiledGrammar> g, int mode) {
    Cost c;
    std::unordered_set<int32_t> seen;
    for (const auto& doc : docs) {
      GrammarMatcher m(g);
      for (int32_t t : doc) {
        const bool first = seen.insert(m.state()).second;
        auto t0 = Clock::now();
        if (mode == 0) {
          if (first) tandem::grammar::ReferencePaths::UncachedMask(m);
        } else if (mode == 2) {
          if (first) tandem::grammar::ReferencePaths::MaskByPosition(m);
        } else {
          m.NextTokenMask();
        }
        const double ms = Ms(Clock::now() - t0);
        c.total_ms += ms;
        ++c.tokens;
        if (first) {
          c.miss_ms += ms;
          ++c.misses;
        }
        if (!m.AcceptToken(t)) break;
      }
    }
    return c;
  };
  const Cost before = replay(fresh(true), 0);
  const Cost compact = replay(fresh(false), 0);
  auto g = fresh(false);
  const Cost cold = replay(g, 1);
  replay(g, 2);  // computes the sets of every position (untimed)
  const Cost known = replay(g, 2);
  const Cost warm = replay(g, 3);
  auto us = [](double ms, int64_t n) { return n ? 1000 * ms / n : 0.0; };
  std::printf(
      "mask %-30s vocab %6d, %5lld tokens, %4lld states: per token (per new state) us: "
      "before %.1f (%.1f) | compact graph %.1f (%.1f) | cold %.1f (%.1f) | known position %.1f "
      "(%.1f) | warm %.2f\n",
      label.c_str(), vocab->size(), static_cast<long long>(cold.tokens),
      static_cast<long long>(cold.misses), us(before.total_ms, before.tokens),
      us(before.miss_ms, before.misses), us(compact.total_ms, compact.tokens),
      us(compact.miss_ms, compact.misses), us(cold.total_ms, cold.tokens),
      us(cold.miss_ms, cold.misses), us(known.total_ms, known.tokens),
      us(known.miss_ms, known.misses), us(warm.total_ms, warm.tokens));
}

void MaskTimes(const std::string& name, const std::string& dir) {
  auto tok = tandem::Tokenizer::FromModelDir(dir);
  if (!tok.ok()) return;
  auto vocab = *tandem::grammar::TokenVocab::FromTokenizer(**tok);
  const std::vector<std::pair<std::string, std::string>> grammars = {
      {"schema", *tandem::grammar::JsonSchemaToGrammar(kSchema)},
      {"any-json", tandem::grammar::AnyJsonGrammar(/*object_only=*/false)}};
  for (const auto& [label, text] : grammars) {
    auto scratch = std::make_shared<const tandem::grammar::CompiledGrammar>(
        *tandem::grammar::ParseGrammar(text), vocab);
    MaskCosts(name + " " + label + " random docs", text, vocab, RandomDocuments(scratch, 20, 60));
  }
}

// Work to step, or a constrained request waiting for its grammar off the engine loop (then
// wait a moment: a synchronous driver has nothing to step meanwhile).
bool Busy(tandem::Engine& e) {
  if (e.HasWork()) return true;
  const tandem::EngineStats s = e.stats();
  if (s.grammar_compile_waiting + s.grammar_mask_waiting == 0) return false;
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  return true;
}

void DecodeRate(const std::string& model_dir, int batch, bool constrained) {
  tandem::EngineBuildOptions b;
  b.model_dir = model_dir;
  b.num_kv_blocks = 1024;
  b.show_progress = false;
  auto built = tandem::BuildEngine(b);
  if (!built.ok()) return;
  tandem::Engine& e = *built->engine;
  for (int i = 0; i < batch; ++i) {
    tandem::EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = {1, static_cast<int32_t>(10 + i), 20, 30};
    r.params.max_tokens = 128;
    r.params.temperature = 1.0f;
    r.params.seed = i;
    if (constrained) {
      r.params.constraint.kind = tandem::grammar::Constraint::Kind::kJsonSchema;
      r.params.constraint.value = R"({"type":"array","items":{"type":"string"}})";
    } else {
      r.params.ignore_eos = true;
    }
    (void)e.AddRequest(r);
  }
  int64_t tokens = 0;
  auto t0 = Clock::now();
  while (Busy(e)) {
    for (const auto& u : e.Step()) tokens += static_cast<int64_t>(u.new_tokens.size());
  }
  const double s = Ms(Clock::now() - t0) / 1000;
  std::printf("decode %-28s batch %2d %-10s: %8.1f tokens/s (%lld tokens)\n",
              std::filesystem::path(model_dir).filename().c_str(), batch,
              constrained ? "json" : "none", tokens / s, static_cast<long long>(tokens));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One timed run on an existing engine: tokens/s; the constrained outputs go to `outputs`.
double TimedRun(tandem::Engine& e, int batch, bool constrained, int max_tokens, float temperature,
                int round, std::vector<std::vector<int32_t>>* outputs) {
  static int next_id = 0;
  std::vector<std::string> ids;
  for (int i = 0; i < batch; ++i) {
    tandem::EngineRequest r;
    r.id = std::to_string(next_id++);
    ids.push_back(r.id);
    r.prompt = {1, static_cast<int32_t>(10 + i), 20, 30};
    r.params.max_tokens = max_tokens;
    r.params.temperature = temperature;
    r.params.seed = round * 1000 + i;
    r.params.ignore_eos = true;
    if (constrained) {
      r.params.constraint.kind = tandem::grammar::Constraint::Kind::kJsonSchema;
      r.params.constraint.value = kSchema;
    }
    (void)e.AddRequest(r);
  }
  std::vector<std::vector<int32_t>> out(batch);
  // Only decode steps of the whole batch count: a constrained sequence ends when its document is
  // complete, and a shrinking batch would otherwise read as a slower grammar; the first step is
  // the prefill.
  int64_t tokens = 0;
  double seconds = 0;
  bool prefill = true;
  while (Busy(e)) {
    auto t0 = Clock::now();
    const auto updates = e.Step();
    const double s = Ms(Clock::now() - t0) / 1000;
    int64_t step_tokens = 0;
    for (const auto& u : updates) {
      step_tokens += static_cast<int64_t>(u.new_tokens.size());
      const size_t k = std::find(ids.begin(), ids.end(), u.request_id) - ids.begin();
      if (k < out.size()) out[k].insert(out[k].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    if (step_tokens == batch && !std::exchange(prefill, false)) {
      tokens += step_tokens;
      seconds += s;
    }
  }
  if (constrained && outputs != nullptr) outputs->insert(outputs->end(), out.begin(), out.end());
  return seconds > 0 ? tokens / seconds : 0.0;
}

int DecodeSideBySide(const std::string& model_dir, int rounds, int max_tokens, float temperature) {
  tandem::EngineBuildOptions b;
  b.model_dir = model_dir;
  b.num_kv_blocks = 2048;
  b.show_progress = false;
  // GRAMMAR_MASK_INLINE_US: the engine thread's CPU budget per mask (0: every uncached mask off
  // the loop, its sequence waiting for it).
  const char* inline_us = std::getenv("GRAMMAR_MASK_INLINE_US");
  if (inline_us != nullptr) b.engine.grammar_mask_inline_us = std::atoll(inline_us);
  auto built = tandem::BuildEngine(b);
  if (!built.ok()) {
    std::fprintf(stderr, "%s\n", built.status().ToString().c_str());
    return 1;
  }
  tandem::Engine& e = *built->engine;
  const std::string name = std::filesystem::path(model_dir).filename().string();
  std::vector<std::vector<int32_t>> outputs;
  for (int batch : {1, 16}) {
    std::vector<double> none, json;
    TimedRun(e, batch, false, 8, temperature, -1, nullptr);  // warm-up
    TimedRun(e, batch, true, 8, temperature, -1, nullptr);
    for (int round = 0; round < rounds; ++round) {
      // ABBA: the order flips every round so neither mode always runs second.
      for (bool constrained : {round % 2 == 1, round % 2 == 0}) {
        const double rate = TimedRun(e, batch, constrained, max_tokens, temperature, round,
                                     constrained ? &outputs : nullptr);
        (constrained ? json : none).push_back(rate);
      }
    }
    // Rounds alternate (none, json, none, json...): each round's ratio compares neighbours in
    // time, so the median ratio and its spread say how much of the difference is noise.
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(100 * (json[r] / none[r] - 1));
    auto lo = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
    auto hi = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    std::printf(
        "decode %-16s t=%.0f batch %2d, %d rounds x %d tokens: none %8.1f [%.1f..%.1f] json "
        "%8.1f [%.1f..%.1f] tokens/s; json vs none per round: median %+.1f%% [%+.1f..%+.1f]\n",
        name.c_str(), temperature, batch, rounds, max_tokens, Median(none), lo(none), hi(none),
        Median(json), lo(json), hi(json), Median(ratio), lo(ratio), hi(ratio));
  }
  // Mask time per token: the constrained outputs replayed through a freshly compiled grammar,
  // before (trie walk per new state) and after (position sets), cold and warm.
  auto tok = tandem::Tokenizer::FromModelDir(model_dir);
  if (!tok.ok()) return 1;
  auto vocab = *tandem::grammar::TokenVocab::FromTokenizer(**tok);
  auto text = tandem::grammar::JsonSchemaToGrammar(kSchema);
  if (!text.ok()) return 1;
  MaskCosts(name + " schema decode outputs", *text, vocab, outputs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = tandem::TestSourceDir();
  const bool masks_only = argc > 1 && std::string(argv[1]) == "--masks";
  if (masks_only) {
    --argc;
    ++argv;
  }
  if (argc > 2 && std::string(argv[1]) == "--decode") {
    return DecodeSideBySide(argv[2], argc > 3 ? std::atoi(argv[3]) : 3,
                            argc > 4 ? std::atoi(argv[4]) : 32,
                            argc > 5 ? std::atof(argv[5]) : 0.0f);
  }
  const std::string model = argc > 1 ? argv[1] : root + "/models/stories260k";
  const std::string suite = argc > 2 ? argv[2] : "/usr/share/json-schema-test-suite/tests";
  auto tok = tandem::Tokenizer::FromModelDir(model);
  if (tok.ok()) CompileTimes(suite, *tandem::grammar::TokenVocab::FromTokenizer(**tok));
  MaskTimes("stories260k", root + "/models/stories260k");
  MaskTimes("llama2", root + "/tests/data/tokenizers/llama2");
  MaskTimes("gpt2", root + "/tests/data/tokenizers/gpt2");
  MaskTimes("llama3", root + "/tests/data/tokenizers/llama3");
  MaskTimes("qwen3", root + "/tests/data/tokenizers/qwen3");
  if (masks_only) return 0;
  for (int batch : {1, 16}) {
    for (bool constrained : {false, true}) DecodeRate(model, batch, constrained);
  }
  return 0;
}
