// `tandem make-model`: writes a random-initialised Llama-family model at a real shape.

#include <cstdio>
#include <string>

#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/engine/model/model_writer.h"
#include "tools/commands.h"

namespace tandem {

int RunMakeModel(int argc, char** argv) {
  std::string preset = "tiny", dtype = "bf16", out, tokenizer_dir;
  int64_t seed = 0, max_shard_bytes = 0, threads = 0;
  FlagSet flags("make-model",
                "Writes a random-initialised model (config.json, safetensors, tokenizer) in\n"
                "Hugging Face layout. Presets: llama-1b, llama-110m, tiny. Same flags, same "
                "bytes.");
  flags.String("preset", &preset, "llama-1b | llama-110m | tiny");
  flags.String("dtype", &dtype, "bf16 or f32");
  flags.String("out", &out, "output directory (required)");
  flags.String("tokenizer-dir", &tokenizer_dir,
               "copy tokenizer files from here (default: tests/data/tokenizers/llama2 of the "
               "source tree)");
  flags.Int("seed", &seed, "random seed");
  flags.Int("max-shard-bytes", &max_shard_bytes, "split into shards of at most this many bytes");
  flags.Int("threads", &threads, "generator threads (0: one per core)");
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  if (out.empty()) {
    std::fprintf(stderr, "make-model: --out is required\n");
    return 2;
  }
  RandomModelOptions options;
  options.preset = preset;
  if (dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else if (dtype == "f32") {
    options.dtype = DType::kF32;
  } else {
    std::fprintf(stderr, "make-model: --dtype must be bf16 or f32\n");
    return 2;
  }
  options.seed = static_cast<uint64_t>(seed);
  options.max_shard_bytes = max_shard_bytes;
  options.num_threads = static_cast<int>(threads);
  options.show_progress = true;
  options.tokenizer_dir = tokenizer_dir.empty()
                              ? std::string(TANDEM_SOURCE_DIR) + "/tests/data/tokenizers/llama2"
                              : tokenizer_dir;
  if (auto st = WriteRandomModel(options, out); !st.ok()) {
    std::fprintf(stderr, "make-model: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  TLOG(INFO) << "wrote " << preset << " (" << dtype << ") to " << out;
  return 0;
}

}  // namespace tandem
