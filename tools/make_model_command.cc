// `tandem make-model`: writes a random-initialised model (Llama, Qwen3) at a real shape.

#include <cstdio>
#include <string>

#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/engine/model/model_writer.h"
#include "tools/commands.h"

namespace tandem {

int RunMakeModel(int argc, char** argv) {
  std::string preset = "tiny", dtype = "bf16", out, tokenizer_dir;
  int64_t seed = 0, max_shard_bytes = 0, threads = 0, layers = 0;
  double norm_std = 0, init_std = RandomModelOptions().init_std;
  FlagSet flags("make-model",
                "Writes a random-initialised model (config.json, safetensors, tokenizer) in\n"
                "Hugging Face layout. Presets: " +
                    RandomModelPresetNames() + ". Same flags, same bytes.");
  const std::string presets = RandomModelPresetNames();
  flags.String("preset", &preset, presets.c_str());
  flags.String("dtype", &dtype, "bf16 or f32");
  flags.String("out", &out, "output directory (required)");
  flags.String("tokenizer-dir", &tokenizer_dir,
               "copy tokenizer files from here (default: the preset family's tokenizer under "
               "tests/data/tokenizers of the source tree: qwen3 for qwen3-*, else llama2)");
  flags.Int("layers", &layers, "number of layers (0: the preset's)");
  flags.Double("norm-std", &norm_std, "norm weights 1 + noise of this standard deviation");
  flags.Double("init-std", &init_std, "standard deviation of the other weights");
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
  options.num_layers = layers;
  options.norm_std = norm_std;
  options.init_std = init_std;
  options.max_shard_bytes = max_shard_bytes;
  options.num_threads = static_cast<int>(threads);
  options.show_progress = true;
  // The Qwen presets (qwen3-moe, Qwen2-MoE too) take the Qwen BPE vocabulary.
  const std::string family = preset.rfind("qwen", 0) == 0 ? "qwen3" : "llama2";
  options.tokenizer_dir = tokenizer_dir.empty()
                              ? std::string(TANDEM_SOURCE_DIR) + "/tests/data/tokenizers/" + family
                              : tokenizer_dir;
  if (auto st = WriteRandomModel(options, out); !st.ok()) {
    std::fprintf(stderr, "make-model: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  TLOG(INFO) << "wrote " << preset << " (" << dtype << ") to " << out;
  return 0;
}

}  // namespace tandem
