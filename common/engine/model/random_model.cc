// WriteRandomModel: random-initialised Hugging Face model directories at real shapes.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/base/half.h"
#include "common/base/log.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/config/model_config.h"
#include "common/engine/model/checkpoint.h"
#include "common/engine/model/model_writer.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The splitmix64 output function: a bijective 64-bit mixer.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t NameKey(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return Mix64(Mix64(seed ^ 0x5eed5eed5eed5eedull) ^ h);
}

// Fills out[0, n) with elements [first, first + n) of tensor `spec`: uniform on [-a, a) with
// a = std * sqrt(3) (so the standard deviation is `std`), or for norm weights (`norm`) norm_base
// plus such a value of standard deviation `norm_std` (norm_base exactly when it is 0). Every value
// is a pure function of (key, index) computed with exact integer arithmetic and one rounding, so
// files do not depend on threads, chunking or the math library.
void Generate(uint64_t key, bool norm, double std, double norm_std, double norm_base, DType dtype,
              int64_t first, int64_t n, void* out) {
  const double scale = (norm ? norm_std : std) * std::sqrt(3.0) / static_cast<double>(1 << 23);
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(norm_base);
    if (!norm || norm_std > 0) {
      const uint64_t bits =
          Mix64(key + static_cast<uint64_t>(first + i + 1) * 0x9e3779b97f4a7c15ull);
      const int32_t r = static_cast<int32_t>(bits >> 40) - (1 << 23);
      v = static_cast<float>(static_cast<double>(r) * scale + (norm ? norm_base : 0.0));
    }
    if (dtype == DType::kBF16) {
      static_cast<uint16_t*>(out)[i] = FloatToBf16(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

bool IsNorm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status CopyTokenizer(const std::string& from, const std::string& to) {
  // NOTICE and LICENSE carry the tokenizer's attribution requirements along with it.
  const char* kFiles[] = {"tokenizer.json",
                          "tokenizer_config.json",
                          "special_tokens_map.json",
                          "tokenizer.model",
                          "NOTICE",
                          "LICENSE"};
  for (const char* name : kFiles) {
    const fs::path src = fs::path(from) / name;
    std::error_code ec;
    if (!fs::exists(src, ec)) {
      if (std::string(name) == "tokenizer.json") {
        return absl::NotFoundError(absl::StrCat(src.string(), ": tokenizer file not found"));
      }
      continue;
    }
    // Copy the bytes, not the permissions: sources may be read-only, and a later run must be
    // able to overwrite the copy.
    TANDEM_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(src.string()));
    TANDEM_RETURN_IF_ERROR(WriteTextFile((fs::path(to) / name).string(), bytes));
  }
  return absl::OkStatus();
}

// Removes weights of an earlier run so that the loader cannot pick up stale files.
void RemoveOldWeights(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kSafetensorsFile || name == kSafetensorsIndexFile ||
        (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
         name.size() > 12 && name.substr(name.size() - 12) == ".safetensors")) {
      fs::remove(e.path(), ec);
    }
  }
}

class RandomModelWriter {
 public:
  RandomModelWriter(const RandomModelOptions& options, ModelConfig config, std::string dir)
      : options_(options),
        config_(std::move(config)),
        dir_(std::move(dir)),
        pool_(options.num_threads > 0 ? options.num_threads : DefaultComputeThreads()) {}

  absl::Status WriteWeights();

 private:
  absl::Status WriteShard(const std::string& path,
                          const std::vector<SafetensorsWriter::Spec>& specs);

  const RandomModelOptions& options_;
  const ModelConfig config_;
  const std::string dir_;
  ThreadPool pool_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  uint64_t bytes_written_ = 0;
  int64_t layers_done_ = 0;
};

absl::Status RandomModelWriter::WriteShard(const std::string& path,
                                           const std::vector<SafetensorsWriter::Spec>& specs) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                          SafetensorsWriter::Create(path, specs));
  constexpr int64_t kChunk = int64_t{1} << 22;  // elements per generated piece
  const size_t elem = DTypeSize(options_.dtype);
  std::vector<uint8_t> buffers[2] = {std::vector<uint8_t>(kChunk * elem),
                                     std::vector<uint8_t>(kChunk * elem)};
  int current = 0;
  std::future<absl::Status> pending;  // the previous piece being written while we generate
  auto wait_pending = [&]() -> absl::Status {
    if (!pending.valid()) return absl::OkStatus();
    return pending.get();
  };
  for (const SafetensorsWriter::Spec& spec : specs) {
    const uint64_t key = NameKey(options_.seed, spec.name);
    const bool norm = IsNorm(spec.name);
    // Gemma 3 multiplies by (1 + w) and initialises w to 0: its norms centre on 0.
    const double norm_base = IsGemma(config_.architecture) ? 0.0 : 1.0;
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    for (int64_t first = 0; first < numel; first += kChunk) {
      const int64_t n = std::min(kChunk, numel - first);
      uint8_t* buf = buffers[current].data();
      pool_.ParallelForGrain(n, 4096, [&](int64_t b, int64_t e) {
        Generate(key, norm, options_.init_std, options_.norm_std, norm_base, options_.dtype,
                 first + b, e - b, buf + b * elem);
      });
      TANDEM_RETURN_IF_ERROR(wait_pending());
      pending = std::async(std::launch::async, [&writer, buf, n, elem] {
        return writer->Append(buf, static_cast<size_t>(n) * elem);
      });
      current ^= 1;
      bytes_written_ += static_cast<uint64_t>(n) * elem;
    }
    if (options_.show_progress && spec.name.find("post_attention_layernorm") != std::string::npos) {
      ++layers_done_;
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      TLOG(INFO) << "wrote layer " << layers_done_ << "/" << config_.num_layers << " ("
                 << bytes_written_ / (1 << 20) << " MiB, "
                 << static_cast<int64_t>(bytes_written_ / (1 << 20) / std::max(s, 1e-3))
                 << " MiB/s)";
    }
  }
  TANDEM_RETURN_IF_ERROR(wait_pending());
  return writer->Finish();
}

absl::Status RandomModelWriter::WriteWeights() {
  const std::vector<SafetensorsWriter::Spec> specs = ModelTensorSpecs(config_, options_.dtype);
  if (options_.max_shard_bytes <= 0) {
    return WriteShard((fs::path(dir_) / kSafetensorsFile).string(), specs);
  }
  std::vector<std::vector<SafetensorsWriter::Spec>> shards;
  uint64_t shard_bytes = 0;
  uint64_t total = 0;
  for (const SafetensorsWriter::Spec& s : specs) {
    if (shards.empty() ||
        (shard_bytes > 0 &&
         shard_bytes + s.nbytes() > static_cast<uint64_t>(options_.max_shard_bytes))) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(s);
    shard_bytes += s.nbytes();
    total += s.nbytes();
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    for (const SafetensorsWriter::Spec& s : shards[i]) index["weight_map"][s.name] = name;
    TANDEM_RETURN_IF_ERROR(WriteShard((fs::path(dir_) / name).string(), shards[i]));
    if (options_.show_progress) {
      TLOG(INFO) << "wrote shard " << i + 1 << "/" << shards.size() << " " << name;
    }
  }
  return WriteTextFile((fs::path(dir_) / kSafetensorsIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace

// model_presets.json, compiled in (tandem_embed_text in cmake/tandem.cmake).
extern const char kModelPresetsJson[];

namespace {

// The presets, parsed once: name -> its config.json object, in the file's order.
const nlohmann::ordered_json& Presets() {
  static const nlohmann::ordered_json* const presets = [] {
    auto* doc = new nlohmann::ordered_json(
        nlohmann::ordered_json::parse(kModelPresetsJson, nullptr, /*allow_exceptions=*/false));
    TANDEM_CHECK(doc->is_object()) << "model_presets.json is not a JSON object";
    return doc;
  }();
  return *presets;
}

}  // namespace

std::string RandomModelPresetNames() {
  std::string names;
  for (const auto& preset : Presets().items()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", preset.key());
  }
  return names;
}

absl::StatusOr<ModelConfig> RandomModelPresetConfig(const std::string& preset) {
  const auto it = Presets().find(preset);
  if (it == Presets().end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown model preset '", preset,
                                                   "' (known: ", RandomModelPresetNames(), ")"));
  }
  return ParseModelConfig(it->dump(), absl::StrCat("model preset ", preset));
}

absl::Status WriteRandomModel(const RandomModelOptions& options, const std::string& out_dir) {
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("random models are written in bf16 or f32, not ",
                                                   std::string(DTypeName(options.dtype))));
  }
  ModelConfig config;
  if (options.config.has_value()) {
    config = *options.config;
  } else {
    TANDEM_ASSIGN_OR_RETURN(config, RandomModelPresetConfig(options.preset));
  }
  if (options.vocab_size > 0) config.vocab_size = options.vocab_size;
  if (options.num_layers > 0) config.num_layers = options.num_layers;
  if (options.max_position_embeddings > 0) {
    config.max_position_embeddings = options.max_position_embeddings;
  }
  if (config.architecture == Architecture::kQwen2 ||
      config.architecture == Architecture::kQwen2Moe) {
    config.attention_bias = true;
  }
  config.qk_norm = config.architecture == Architecture::kQwen3 ||
                   config.architecture == Architecture::kGemma3 ||
                   config.architecture == Architecture::kQwen3Moe;
  if (IsGemma(config.architecture)) {
    const bool gemma2 = config.architecture == Architecture::kGemma2;
    config.activation = Activation::kGeluTanh;
    if (config.sliding_layers.size() != static_cast<size_t>(config.num_layers)) {
      // Gemma 2: every other layer global; Gemma 3: every sixth.
      const int64_t every = gemma2 ? 2 : 6;
      config.sliding_layers.assign(static_cast<size_t>(config.num_layers), 1);
      for (int64_t i = every - 1; i < config.num_layers; i += every) config.sliding_layers[i] = 0;
    }
    if (config.query_pre_attn_scalar == 0) {
      config.query_pre_attn_scalar = static_cast<double>(config.head_dim);
    }
    if (config.rope_local_theta == 0 && !gemma2) config.rope_local_theta = 10000.0;
  }
  config.architecture_name = ArchitectureClassName(config.architecture);
  if (config.model_type.empty()) config.model_type = ArchitectureModelType(config.architecture);
  config.torch_dtype = options.dtype == DType::kBF16 ? "bfloat16" : "float32";
  TANDEM_RETURN_IF_ERROR(ValidateModelConfig(config, out_dir + "/config.json"));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  RemoveOldWeights(out_dir);
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(
      WriteTextFile((fs::path(out_dir) / "config.json").string(), ModelConfigToJson(config)));
  nlohmann::ordered_json gen;
  gen["bos_token_id"] = config.bos_token_id >= 0 ? nlohmann::ordered_json(config.bos_token_id)
                                                 : nlohmann::ordered_json(nullptr);
  if (config.eos_token_ids.size() == 1) {
    gen["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    gen["eos_token_id"] = config.eos_token_ids;
  }
  gen["do_sample"] = false;
  TANDEM_RETURN_IF_ERROR(
      WriteTextFile((fs::path(out_dir) / "generation_config.json").string(), gen.dump(2) + "\n"));
  if (!options.tokenizer_dir.empty()) {
    TANDEM_RETURN_IF_ERROR(CopyTokenizer(options.tokenizer_dir, out_dir));
  }
  RandomModelWriter writer(options, config, out_dir);
  TANDEM_RETURN_IF_ERROR(writer.WriteWeights());
  if (options.show_progress) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    TLOG(INFO) << "wrote random model (" << (options.config ? "custom" : options.preset) << ", "
               << std::string(DTypeName(options.dtype)) << ", seed " << options.seed << ") to "
               << out_dir << " in " << s << " s";
  }
  return absl::OkStatus();
}

}  // namespace tandem
