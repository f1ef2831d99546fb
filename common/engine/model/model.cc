#include "common/engine/model/model.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/log.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/engine/model/checkpoint.h"
#include "common/engine/model/convert.h"

namespace tandem {
namespace {

// 64-bit FNV-1a: a small, stable digest for model ids (not a cryptographic hash).
class Fnv1a {
 public:
  void Add(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
  }
  void Add(std::string_view s) { Add(s.data(), s.size()); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

Model::~Model() = default;

// Builds a Model from a checkpoint directory; see LoadModel.
class ModelLoader {
 public:
  ModelLoader(const std::string& dir, const LoadOptions& options)
      : dir_(dir), options_(options), model_(new Model()) {}

  absl::StatusOr<std::unique_ptr<Model>> Load();

 private:
  absl::Status ResolveWeightDType();
  // Fills `out` with tensor `name`, checked against `shape` and held as `dtype`: served from the
  // mapping when the stored dtype matches and the bytes are naturally aligned, else converted (or
  // copied) into an owned 64-byte-aligned buffer.
  absl::Status LoadTensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                          Tensor* out);
  absl::Status LoadLayer(int64_t i, LayerWeights* layer);
  void WarnAboutUnusedTensors() const;
  std::string ModelId() const;
  ThreadPool* pool() {
    if (pool_ == nullptr) {
      pool_ = std::make_unique<ThreadPool>(options_.num_threads > 0 ? options_.num_threads
                                                                    : DefaultComputeThreads());
    }
    return pool_.get();
  }

  const std::string dir_;
  const LoadOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<ThreadPool> pool_;
  std::set<std::string> used_;
  Fnv1a digest_;
  size_t mapped_bytes_ = 0;
  size_t converted_bytes_ = 0;
  int converted_tensors_ = 0;
};

absl::Status ModelLoader::ResolveWeightDType() {
  if (!options_.weight_dtype_auto) {
    if (options_.weight_dtype != DType::kF32 && options_.weight_dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight dtype must be f32 or bf16, got ", std::string(DTypeName(options_.weight_dtype))));
    }
    model_->weight_dtype_ = options_.weight_dtype;
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef embed, ckpt_->Get("model.embed_tokens.weight"));
  model_->weight_dtype_ = embed.entry->dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadTensor(const std::string& name, const std::vector<int64_t>& shape,
                                     DType dtype, Tensor* out) {
  TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef ref, ckpt_->Get(name));
  const SafetensorsEntry& e = *ref.entry;
  if (e.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(ref.file->path(), ": tensor '", name, "' has shape ", ShapeString(e.shape),
                     ", expected ", ShapeString(shape), " from config.json"));
  }
  used_.insert(name);
  // Digest a sample of the bytes so that models with equal shapes but different weights differ.
  const size_t sample = std::min<size_t>(256, e.nbytes());
  digest_.Add(name);
  digest_.Add(e.data, sample);
  digest_.Add(e.data + e.nbytes() - sample, sample);

  out->dtype = dtype;
  out->shape = shape;
  const size_t elem = DTypeSize(dtype);
  if (e.dtype == dtype && reinterpret_cast<uintptr_t>(e.data) % elem == 0) {
    out->data = e.data;
    mapped_bytes_ += e.nbytes();
    return absl::OkStatus();
  }
  const size_t bytes = static_cast<size_t>(out->numel()) * elem;
  uint8_t* dst = nullptr;
  model_->owned_.push_back(AllocateAligned(bytes, &dst));
  model_->owned_bytes_ += bytes;
  ConvertElements(e.data, e.dtype, dst, dtype, out->numel(), pool());
  out->data = dst;
  converted_bytes_ += bytes;
  ++converted_tensors_;
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadLayer(int64_t i, LayerWeights* l) {
  const ModelConfig& c = model_->config_;
  const DType w = model_->weight_dtype_;
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  const int64_t h = c.hidden_size;
  const int64_t f = c.intermediate_size;
  TANDEM_RETURN_IF_ERROR(
      LoadTensor(p + "input_layernorm.weight", {h}, DType::kF32, &l->input_norm));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "self_attn.q_proj.weight", {q_dim, h}, w, &l->q_proj));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "self_attn.k_proj.weight", {kv_dim, h}, w, &l->k_proj));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "self_attn.v_proj.weight", {kv_dim, h}, w, &l->v_proj));
  if (c.attention_bias) {
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.q_proj.bias", {q_dim}, DType::kF32, &l->q_bias));
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.k_proj.bias", {kv_dim}, DType::kF32, &l->k_bias));
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.v_proj.bias", {kv_dim}, DType::kF32, &l->v_bias));
  }
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "self_attn.o_proj.weight", {h, q_dim}, w, &l->o_proj));
  TANDEM_RETURN_IF_ERROR(
      LoadTensor(p + "post_attention_layernorm.weight", {h}, DType::kF32, &l->post_norm));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "mlp.gate_proj.weight", {f, h}, w, &l->gate_proj));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "mlp.up_proj.weight", {f, h}, w, &l->up_proj));
  TANDEM_RETURN_IF_ERROR(LoadTensor(p + "mlp.down_proj.weight", {h, f}, w, &l->down_proj));
  return absl::OkStatus();
}

void ModelLoader::WarnAboutUnusedTensors() const {
  std::vector<std::string> unused;
  for (const auto& file : ckpt_->files()) {
    for (const SafetensorsEntry& e : file->header().entries) {
      // Old exports carry rotary tables the engine recomputes; tied lm_heads are ignored like
      // transformers does.
      if (used_.count(e.name) || e.name.find("rotary_emb.inv_freq") != std::string::npos ||
          e.name == "lm_head.weight") {
        continue;
      }
      unused.push_back(e.name);
    }
  }
  if (!unused.empty()) {
    TLOG(WARNING) << ckpt_->source() << ": " << unused.size()
                  << " tensors are not used by the model, e.g. '" << unused[0] << "'";
  }
}

std::string ModelLoader::ModelId() const {
  const ModelConfig& c = model_->config_;
  Fnv1a digest = digest_;
  digest.Add(ModelConfigToJson(c));
  for (const auto& file : ckpt_->files()) digest.Add(file->header().json);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(digest.value()));
  return absl::StrCat(c.model_type, "-L", c.num_layers, "-H", c.hidden_size, "-F",
                      c.intermediate_size, "-A", c.num_heads, "x", c.head_dim, "-KV",
                      c.num_kv_heads, "-V", c.vocab_size, "-",
                      std::string(DTypeName(model_->weight_dtype_)), "-", std::string(hash, 12));
}

absl::StatusOr<std::unique_ptr<Model>> ModelLoader::Load() {
  const auto start = std::chrono::steady_clock::now();
  model_->dir_ = dir_;
  TANDEM_ASSIGN_OR_RETURN(model_->config_,
                          LoadModelConfig((std::filesystem::path(dir_) / "config.json").string()));
  TANDEM_RETURN_IF_ERROR(MergeGenerationConfig(dir_, &model_->config_));
  TANDEM_ASSIGN_OR_RETURN(ckpt_, Checkpoint::Open(dir_, options_.show_progress));
  TANDEM_RETURN_IF_ERROR(ResolveWeightDType());

  const ModelConfig& c = model_->config_;
  ModelWeights& w = model_->weights_;
  const DType wt = model_->weight_dtype_;
  TANDEM_RETURN_IF_ERROR(
      LoadTensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, wt, &w.embed_tokens));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    TANDEM_RETURN_IF_ERROR(LoadLayer(i, &w.layers[i]));
  }
  TANDEM_RETURN_IF_ERROR(
      LoadTensor("model.norm.weight", {c.hidden_size}, DType::kF32, &w.final_norm));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    TANDEM_RETURN_IF_ERROR(
        LoadTensor("lm_head.weight", {c.vocab_size, c.hidden_size}, wt, &w.lm_head));
  }
  WarnAboutUnusedTensors();
  model_->model_id_ = ModelId();
  model_->files_ = ckpt_->ReleaseMappings();

  if (options_.show_progress) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (converted_tensors_ > 0) {
      TLOG(INFO) << "converted " << converted_tensors_ << " tensors ("
                 << converted_bytes_ / (1 << 20) << " MiB) to their in-memory dtype";
    }
    TLOG(INFO) << "loaded " << model_->model_id_ << " from " << dir_ << " in "
               << static_cast<int64_t>(ms) << " ms (" << ckpt_->files().size() << " file(s), "
               << mapped_bytes_ / (1 << 20) << " MiB mapped, " << converted_bytes_ / (1 << 20)
               << " MiB converted, weights " << DTypeName(wt) << ")";
  }
  return std::move(model_);
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir,
                                                 const LoadOptions& options) {
  return ModelLoader(dir, options).Load();
}

}  // namespace tandem
