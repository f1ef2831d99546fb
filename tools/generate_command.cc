// `tandem generate`: runs one prompt through the engine in this process and streams the text.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/config/default_model.h"
#include "common/engine/engine_builder.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace tandem {

int RunGenerate(int argc, char** argv) {
  std::string model_dir = DefaultModelDir();
  std::string prompt = "Once upon a time";
  std::string dtype = "auto";
  int32_t max_tokens = 64;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  int32_t top_k = 0;
  int64_t seed = -1, threads = 0;
  bool print_ids = false, ignore_eos = false, echo = false, quiet = false;

  FlagSet flags("generate", "Generates a continuation of --prompt and streams it to stdout.");
  flags.String("model", &model_dir, "Hugging Face model directory");
  flags.String("prompt", &prompt, "prompt text");
  flags.Int32("max-tokens", &max_tokens, "new tokens at most");
  flags.Float("temperature", &temperature, "sampling temperature; 0 is greedy");
  flags.Int32("top-k", &top_k, "keep the k most likely tokens (0: off)");
  flags.Float("top-p", &top_p, "nucleus sampling mass (1: off)");
  flags.Float("min-p", &min_p, "drop tokens below min-p times the top probability");
  flags.Float("repetition-penalty", &repetition_penalty, "HF repetition penalty (1: off)");
  flags.Int("seed", &seed, "sampling seed (-1: random)");
  flags.String("dtype", &dtype, "weight dtype in memory: auto, f32 or bf16");
  flags.Int("threads", &threads, "compute threads (0: one per core)");
  flags.Bool("ignore-eos", &ignore_eos, "keep generating after end-of-sequence");
  flags.Bool("echo", &echo, "print the prompt before the continuation");
  flags.Bool("print-ids", &print_ids, "print the generated token ids on a last line");
  flags.Bool("quiet", &quiet, "log warnings and errors only");
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  if (quiet) ConfigureLogging({LogLevel::kWarning, false, "generate"});

  auto tokenizer = Tokenizer::FromModelDir(model_dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto ids = (*tokenizer)->Encode(prompt, /*add_special_tokens=*/true);
  if (!ids.ok()) {
    std::fprintf(stderr, "error: prompt: %s\n", std::string(ids.status().message()).c_str());
    return 1;
  }

  EngineBuildOptions options;
  options.model_dir = model_dir;
  options.weight_dtype = dtype;
  options.threads = static_cast<int>(threads);
  options.show_progress = !quiet;
  options.engine.scheduler.max_num_seqs = 1;
  // Enough KV for this one request, rounded up to whole blocks.
  options.num_kv_blocks = (static_cast<int64_t>(ids->size()) + max_tokens) / options.block_size + 2;
  auto built = BuildEngine(options);
  if (!built.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(built.status().message()).c_str());
    return 1;
  }
  Engine& engine = *built->engine;

  EngineRequest request;
  request.id = "generate";
  request.prompt = *ids;
  request.params.max_tokens = max_tokens;
  request.params.temperature = temperature;
  request.params.top_k = top_k;
  request.params.top_p = top_p;
  request.params.min_p = min_p;
  request.params.repetition_penalty = repetition_penalty;
  request.params.ignore_eos = ignore_eos;
  if (seed >= 0) request.params.seed = static_cast<uint64_t>(seed);
  if (auto st = engine.AddRequest(request); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return 1;
  }

  // Prime the stream decoder with the prompt so the continuation's spacing is right.
  StreamDecoder stream(**tokenizer, /*skip_special_tokens=*/true);
  for (int32_t id : *ids) {
    auto chunk = stream.Step(id);
    if (echo && chunk.has_value()) std::fputs(chunk->c_str(), stdout);
  }
  std::vector<int32_t> generated;
  absl::Time start = absl::Now();
  absl::Time first_token;
  bool done = false;
  while (!done && engine.HasWork()) {
    for (const SequenceUpdate& u : engine.Step()) {
      for (int32_t id : u.new_tokens) {
        if (generated.empty()) first_token = absl::Now();
        generated.push_back(id);
        if (auto chunk = stream.Step(id); chunk.has_value()) {
          std::fputs(chunk->c_str(), stdout);
          std::fflush(stdout);
        }
      }
      if (u.finished) {
        done = true;
        if (!u.status.ok()) {
          std::fprintf(stderr, "\nerror: %s\n", std::string(u.status.message()).c_str());
          return 1;
        }
      }
    }
  }
  std::fputs("\n", stdout);
  if (print_ids) std::printf("ids: %s\n", absl::StrJoin(generated, ",").c_str());
  if (!quiet && generated.size() > 1) {
    double decode_s = absl::ToDoubleSeconds(absl::Now() - first_token);
    TLOG(INFO) << "generated " << generated.size() << " tokens; prompt " << ids->size()
               << " tokens; time to first token " << absl::ToDoubleMilliseconds(first_token - start)
               << " ms; decode " << (generated.size() - 1) / decode_s << " tokens/s";
  }
  return 0;
}

}  // namespace tandem
