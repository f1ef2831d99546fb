// lora_bench: multi-LoRA decode against the base model, side by side in one process:
// decode tokens/s of a batch spread over several rank-r adapters and of batch 1 with one
// adapter, each as a ratio to the base model at the same batch; the time to load one adapter;
// and loading many at once.
//
//   lora_bench --model DIR [--dtype bf16] [--quantization int8] [--adapters 8] [--rank 16]
//              [--batch 16] [--tokens 16] [--reps 3] [--threads 0] [--loaded 32]
//
// Random adapters (lora_writer.h, targets q/k/v/o/gate/up/down) go to a temporary directory.
// Each repetition runs the variants in alternating order; medians are reported, and the median of
// each repetition's adapter / base ratio ("paired"). Decode rate: tokens after the first step
// (every prompt is prefilled in the first) over their time.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/lora/lora_adapter.h"
#include "common/engine/lora/lora_writer.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Decode tokens/s of `batch` requests, request i with adapters[i % size] ("" : base).
double DecodeRate(Engine& engine, int64_t batch, int64_t tokens,
                  const std::vector<std::string>& adapters, int64_t* serial) {
  for (int64_t i = 0; i < batch; ++i) {
    EngineRequest r;
    r.id = absl::StrCat("r", (*serial)++);
    r.prompt = {1};
    for (int k = 0; k < 7; ++k)
      r.prompt.push_back(static_cast<int32_t>(10 + (*serial * 7 + k) % 500));
    r.params.max_tokens = static_cast<int32_t>(tokens);
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    r.lora_name = adapters[i % adapters.size()];
    if (auto st = engine.AddRequest(r); !st.ok()) {
      std::fprintf(stderr, "lora_bench: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
  }
  engine.Step();  // the prompts
  const auto start = Clock::now();
  int64_t generated = 0;
  while (engine.HasWork()) {
    for (const SequenceUpdate& u : engine.Step()) generated += u.new_tokens.size();
  }
  return generated / std::chrono::duration<double>(Clock::now() - start).count();
}

int Run(int argc, char** argv) {
  EngineBuildOptions b;
  int64_t adapters = 8, rank = 16, batch = 16, tokens = 16, reps = 3, loaded = 32;
  FlagSet flags("lora_bench", "multi-LoRA decode against the base model");
  flags.String("model", &b.model_dir, "model directory");
  flags.String("dtype", &b.weight_dtype, "weights: auto, f32 or bf16");
  flags.String("quantization", &b.quantization, "none, int8 or int4");
  flags.Int32("threads", &b.threads, "compute threads (0: one per core)");
  flags.Int("adapters", &adapters, "adapters the batch is spread over");
  flags.Int("rank", &rank, "their rank");
  flags.Int("batch", &batch, "requests in the batch");
  flags.Int("tokens", &tokens, "tokens per request");
  flags.Int("reps", &reps, "repetitions");
  flags.Int("loaded", &loaded, "adapters loaded at once for the load test");
  if (auto code = flags.ParseCommandLine(argc, argv)) return *code;

  auto config = LoadModelConfig(b.model_dir + "/config.json");
  if (!config.ok()) {
    std::fprintf(stderr, "lora_bench: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  const std::string tmp =
      (std::filesystem::temp_directory_path() / absl::StrCat("lora_bench_", getpid())).string();
  std::vector<std::string> names;
  for (int64_t i = 0; i < adapters; ++i) {
    RandomLoraOptions o;
    o.rank = rank;
    o.seed = static_cast<uint64_t>(i + 1);
    const std::string dir = absl::StrCat(tmp, "/a", i);
    if (auto st = WriteRandomLoraAdapter(*config, o, dir); !st.ok()) {
      std::fprintf(stderr, "lora_bench: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    names.push_back(absl::StrCat("a", i));
    b.lora.modules.push_back(absl::StrCat("a", i, "=", dir));
  }
  // Loading: one adapter at a time (median), then `loaded` at once (the same files, other names).
  LoraLimits limits;
  limits.max_lora_rank = rank;
  // As the engine keeps them (--lora-dtype auto): f32 over f32 weights, else bf16.
  limits.dtype = b.weight_dtype == "f32" && b.quantization == "none" ? DType::kF32 : DType::kBF16;
  std::vector<double> load_ms;
  size_t bytes = 0;
  for (int64_t i = 0; i < std::max<int64_t>(reps, 3); ++i) {
    const auto start = Clock::now();
    auto a = LoadLoraAdapter("x", absl::StrCat(tmp, "/a", i % adapters), *config, limits);
    load_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (!a.ok()) return 1;
    bytes = (*a)->bytes();
  }
  {
    LoraOptions many;
    many.dtype = limits.dtype == DType::kF32 ? "float32" : "bfloat16";
    many.max_loras = 1;
    many.max_cpu_loras = loaded;
    many.max_lora_rank = rank;
    LoraRegistry registry(*config, many);
    const auto start = Clock::now();
    for (int64_t i = 0; i < loaded; ++i) {
      if (!registry.Load(absl::StrCat("m", i), absl::StrCat(tmp, "/a", i % adapters)).ok()) {
        return 1;
      }
    }
    std::printf("loaded %zu rank-%lld adapters at once (%.0f MiB) in %.0f ms\n", registry.size(),
                static_cast<long long>(rank), registry.size() * bytes / 1048576.0,
                std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::printf("load one rank-%lld adapter (%.1f MiB): median %.1f ms\n",
              static_cast<long long>(rank), bytes / 1048576.0, Median(load_ms));

  b.show_progress = false;
  b.lora.max_loras = adapters;
  b.lora.max_cpu_loras = adapters;
  b.lora.max_lora_rank = rank;
  b.engine.enable_prefix_cache = false;
  b.kv_cache_bytes = int64_t{256} << 20;
  auto built = BuildEngine(b);
  if (!built.ok()) {
    std::fprintf(stderr, "lora_bench: %s\n", std::string(built.status().message()).c_str());
    return 1;
  }
  Engine& engine = *built->engine;
  int64_t serial = 0;
  struct Variant {
    std::string name;
    int64_t batch;
    std::vector<std::string> adapters;
    std::vector<double> rates;
  };
  std::vector<Variant> v = {{absl::StrCat("base, batch ", batch), batch, {""}, {}},
                            {absl::StrCat(adapters, " adapters, batch ", batch), batch, names, {}},
                            {"base, batch 1", 1, {""}, {}},
                            {"1 adapter, batch 1", 1, {names[0]}, {}}};
  DecodeRate(engine, 2, 3, names, &serial);  // warm up
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < v.size(); ++k) {
      Variant& x = v[rep % 2 == 0 ? k : v.size() - 1 - k];
      x.rates.push_back(DecodeRate(engine, x.batch, tokens, x.adapters, &serial));
    }
  }
  for (const Variant& x : v)
    std::printf("%-24s decode %8.2f tok/s\n", x.name.c_str(), Median(x.rates));
  std::printf("ratio batch %lld: %.3f; ratio batch 1: %.3f\n", static_cast<long long>(batch),
              Median(v[1].rates) / Median(v[0].rates), Median(v[3].rates) / Median(v[2].rates));
  // Each repetition's adapter run against its base run at the same batch (adjacent in time, so
  // a load that drifts over the run moves both), then the median over the repetitions.
  std::vector<double> paired_batch, paired_one;
  for (int64_t rep = 0; rep < reps; ++rep) {
    paired_batch.push_back(v[1].rates[rep] / v[0].rates[rep]);
    paired_one.push_back(v[3].rates[rep] / v[2].rates[rep]);
  }
  std::printf("paired ratio batch %lld: %.3f; paired ratio batch 1: %.3f\n",
              static_cast<long long>(batch), Median(paired_batch), Median(paired_one));
  std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Run(argc, argv); }
