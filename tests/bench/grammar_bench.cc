// Structured-output costs, side by side in one run (docs/benchmarks.md):
//  1. schema compile time (JSON Schema -> grammar -> compiled) over a corpus: median and p99;
//  2. mask time per generated token on real tokenizers (cache hits and misses together);
//  3. engine decode tokens/s with a JSON-schema constraint versus none, batch 1 and 16.
// Usage: grammar_bench [model_dir] [json-schema-test-suite tests dir]
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
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

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

void MaskTimes(const std::string& name, const std::string& dir) {
  auto tok = tandem::Tokenizer::FromModelDir(dir);
  if (!tok.ok()) return;
  auto vocab = tandem::grammar::TokenVocab::FromTokenizer(**tok);
  tandem::grammar::GrammarCompiler compiler(*vocab);
  tandem::grammar::Constraint c;
  c.kind = tandem::grammar::Constraint::Kind::kJsonSchema;
  c.value = kSchema;
  auto g = compiler.Compile(c);
  std::mt19937 rng(5);
  double total = 0;
  int tokens = 0;
  for (int doc = 0; doc < 20; ++doc) {
    tandem::grammar::GrammarMatcher m(*g);
    for (int step = 0; step < 60 && !m.IsTerminated(); ++step) {
      auto t0 = Clock::now();
      auto mask = m.NextTokenMask();
      total += Ms(Clock::now() - t0);
      ++tokens;
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < (*vocab)->size(); ++id) {
        if (((*mask)[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
      }
      if (ids.empty()) break;
      m.AcceptToken(ids[rng() % ids.size()]);
    }
  }
  std::printf("mask per token, %-12s (%6d tokens): %.1f us (20 documents, cache warming up)\n",
              name.c_str(), (*vocab)->size(), 1000 * total / tokens);
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
  while (e.HasWork()) {
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
  int64_t tokens = 0;
  auto t0 = Clock::now();
  while (e.HasWork()) {
    for (const auto& u : e.Step()) {
      tokens += static_cast<int64_t>(u.new_tokens.size());
      const size_t k = std::find(ids.begin(), ids.end(), u.request_id) - ids.begin();
      if (k < out.size()) out[k].insert(out[k].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  const double s = Ms(Clock::now() - t0) / 1000;
  if (constrained && outputs != nullptr) outputs->insert(outputs->end(), out.begin(), out.end());
  return tokens / s;
}

int DecodeSideBySide(const std::string& model_dir, int rounds, int max_tokens, float temperature) {
  tandem::EngineBuildOptions b;
  b.model_dir = model_dir;
  b.num_kv_blocks = 2048;
  b.show_progress = false;
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
    for (int round = 0; round < rounds; ++round) {
      none.push_back(TimedRun(e, batch, false, max_tokens, temperature, round, nullptr));
      json.push_back(TimedRun(e, batch, true, max_tokens, temperature, round, &outputs));
    }
    const double n = Median(none), j = Median(json);
    std::printf(
        "decode %-16s t=%.0f batch %2d, %d rounds x %d tokens: none %8.1f json %8.1f tokens/s "
        "(json %+.1f%%)\n",
        name.c_str(), temperature, batch, rounds, max_tokens, n, j, 100 * (j / n - 1));
  }
  // Mask time per token: the constrained outputs replayed through a fresh (cold) mask cache and
  // then again warm.
  auto tok = tandem::Tokenizer::FromModelDir(model_dir);
  if (!tok.ok()) return 1;
  auto vocab = *tandem::grammar::TokenVocab::FromTokenizer(**tok);
  tandem::grammar::GrammarCompiler compiler(vocab);
  tandem::grammar::Constraint c;
  c.kind = tandem::grammar::Constraint::Kind::kJsonSchema;
  c.value = kSchema;
  auto g = compiler.Compile(c);
  if (!g.ok()) return 1;
  for (const char* pass : {"cold cache", "warm cache"}) {
    double total = 0;
    int64_t n = 0;
    for (const auto& out : outputs) {
      tandem::grammar::GrammarMatcher m(*g);
      for (int32_t t : out) {
        auto t0 = Clock::now();
        m.NextTokenMask();
        total += Ms(Clock::now() - t0);
        ++n;
        if (!m.AcceptToken(t)) break;
      }
    }
    std::printf("mask per token, %-16s (%d tokens, %lld masks, %s): %.1f us\n", name.c_str(),
                vocab->size(), static_cast<long long>(n), pass, n ? 1000 * total / n : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = TANDEM_SOURCE_DIR;
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
  for (int batch : {1, 16}) {
    for (bool constrained : {false, true}) DecodeRate(model, batch, constrained);
  }
  return 0;
}
