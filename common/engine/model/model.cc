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
#include "common/engine/model/fp8_checkpoint.h"
#include "common/engine/model/int4_checkpoint.h"
#include "common/engine/model/quantize.h"

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

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

absl::Status NotFloat(const Checkpoint::TensorRef& ref) {
  return absl::InvalidArgumentError(
      absl::StrCat(ref.file->path(), ": tensor '", ref.entry->name, "' has unsupported dtype '",
                   SafetensorsDTypeName(ref.entry->dtype), "' (expected F32, BF16 or F16)"));
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
  // Tensor `name` checked to be a float tensor of `shape` (and digested).
  absl::StatusOr<const SafetensorsEntry*> CheckedEntry(const std::string& name,
                                                       const std::vector<int64_t>& shape);
  // A projection [N, K]: LoadDense, or quantized from the stored values when the options ask.
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape, Tensor* out);
  // Rows [row_begin, row_begin + N) of the fused projection `name`, stored [total_rows, K] (Phi-3's
  // qkv_proj and gate_up_proj), as LoadMatrix would load a projection [N, K] of its own: a view
  // into the mapping when no conversion is needed, else converted, tiled or quantized.
  absl::Status LoadMatrixRows(const std::string& name, const std::vector<int64_t>& stored_shape,
                              int64_t row_begin, int64_t N, Tensor* out);
  // A norm weight [dim] in f32; Gemma 3's (1 + w), copied.
  absl::Status LoadNorm(const std::string& name, int64_t dim, Tensor* out);
  // A dense projection: LoadTensor, or bf16 tiles (TileBf16Into) when the options ask for them.
  absl::Status LoadDense(const std::string& name, const std::vector<int64_t>& shape, Tensor* out);
  // Whether dense matrices go into bf16 tiles (LoadOptions::bf16_layout, bf16 weights).
  bool TilesBf16() const {
    return options_.bf16_layout == WeightLayout::kTiles16 && model_->weight_dtype_ == DType::kBF16;
  }
  // [N, K] f32/bf16/f16 rows at `src` as bf16 in WeightLayout::kTiles16, in an owned buffer.
  void TileBf16Into(const uint8_t* src, DType src_dtype, int64_t N, int64_t K, Tensor* out);
  // Quantizes [N, K] f32/bf16/f16 rows at `src` into owned buffers described by `out`.
  void QuantizeInto(const uint8_t* src, DType src_dtype, int64_t N, int64_t K, Tensor* out);
  // Moves a quantized matrix into owned buffers described by `out`.
  void StoreQuantized(QuantizedMatrix q, Tensor* out);
  // An fp8 checkpoint's projection `name` (F8_E4M3) with its `<prefix>.weight_scale`.
  absl::Status LoadFp8(const std::string& name, const std::vector<int64_t>& shape, Tensor* out);
  // An AWQ / GPTQ projection `<prefix>.qweight` etc. of logical shape [N, K].
  absl::Status LoadPacked(const std::string& prefix, const std::vector<int64_t>& shape,
                          Tensor* out);
  // Marks a tensor used and adds a sample of its bytes to the model id's digest.
  void Digest(const std::string& name, const SafetensorsEntry& e);
  absl::Status LoadLayer(int64_t i, LayerWeights* layer);
  void WarnAboutUnusedTensors() const;
  std::string ModelId() const;
  std::string QuantSuffix() const;
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
  CheckpointQuantConfig ckpt_quant_;
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
  if (!IsFloat(embed.entry->dtype)) return NotFloat(embed);
  model_->weight_dtype_ = embed.entry->dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  return absl::OkStatus();
}

absl::StatusOr<const SafetensorsEntry*> ModelLoader::CheckedEntry(
    const std::string& name, const std::vector<int64_t>& shape) {
  TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef ref, ckpt_->Get(name));
  const SafetensorsEntry& e = *ref.entry;
  if (!IsFloat(e.dtype)) return NotFloat(ref);
  if (e.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(ref.file->path(), ": tensor '", name, "' has shape ", ShapeString(e.shape),
                     ", expected ", ShapeString(shape), " from config.json"));
  }
  Digest(name, e);
  return ref.entry;
}

absl::Status ModelLoader::LoadTensor(const std::string& name, const std::vector<int64_t>& shape,
                                     DType dtype, Tensor* out) {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsEntry* entry, CheckedEntry(name, shape));
  const SafetensorsEntry& e = *entry;
  out->dtype = dtype;
  out->shape = shape;
  const size_t elem = DTypeSize(dtype);
  if (options_.map_weights && e.dtype == dtype && reinterpret_cast<uintptr_t>(e.data) % elem == 0) {
    out->data = e.data;
    mapped_bytes_ += e.nbytes();
    return absl::OkStatus();
  }
  const size_t bytes = static_cast<size_t>(out->numel()) * elem;
  void* dst = model_->arena_.Allocate(bytes);
  model_->owned_bytes_ += bytes;
  ConvertElements(e.data, e.dtype, dst, dtype, out->numel(), pool());
  out->data = dst;
  converted_bytes_ += bytes;
  ++converted_tensors_;
  return absl::OkStatus();
}

void ModelLoader::Digest(const std::string& name, const SafetensorsEntry& e) {
  used_.insert(name);
  // Digest a sample of the bytes so that models with equal shapes but different weights differ.
  const size_t sample = std::min<size_t>(256, e.nbytes());
  digest_.Add(name);
  digest_.Add(e.data, sample);
  digest_.Add(e.data + e.nbytes() - sample, sample);
}

void ModelLoader::QuantizeInto(const uint8_t* src, DType src_dtype, int64_t N, int64_t K,
                               Tensor* out) {
  const WeightQuant quant = options_.quantization;
  const size_t row_bytes = static_cast<size_t>(K) * DTypeSize(src_dtype);
  QuantizedMatrix q = Quantize(
      quant, N, K, options_.quant_group_size,
      [&](int64_t n, float* row) {
        ConvertElements(src + static_cast<size_t>(n) * row_bytes, src_dtype, row, DType::kF32, K);
      },
      pool());
  StoreQuantized(std::move(q), out);
}

void ModelLoader::StoreQuantized(QuantizedMatrix q, Tensor* out) {
  out->dtype = model_->weight_dtype_;
  out->shape = {q.rows, q.cols};
  out->quant = q.quant;
  out->group_size = q.group_size;
  if (options_.quant_layout == WeightLayout::kTiles16) ToTiles16(&q);
  out->layout = q.layout;
  model_->owned_bytes_ += q.codes.size() + (q.scales.size() + q.zeros.size()) * sizeof(float);
  HugePageArena& arena = model_->arena_;
  out->data = arena.Copy(q.codes);
  out->scales = arena.Copy(q.scales);
  out->zeros = arena.Copy(q.zeros);  // nullptr when there are none
  ++converted_tensors_;
  converted_bytes_ += out->stored_bytes();
}

absl::Status ModelLoader::LoadPacked(const std::string& prefix, const std::vector<int64_t>& shape,
                                     Tensor* out) {
  PackedInt4Refs refs;
  TANDEM_ASSIGN_OR_RETURN(refs.qweight, ckpt_->Get(prefix + ".qweight"));
  TANDEM_ASSIGN_OR_RETURN(refs.qzeros, ckpt_->Get(prefix + ".qzeros"));
  TANDEM_ASSIGN_OR_RETURN(refs.scales, ckpt_->Get(prefix + ".scales"));
  const bool gptq = ckpt_quant_.method == CheckpointQuantMethod::kGptq;
  if (gptq && (ckpt_quant_.desc_act || ckpt_->Has(prefix + ".g_idx"))) {
    TANDEM_ASSIGN_OR_RETURN(refs.g_idx, ckpt_->Get(prefix + ".g_idx"));
  }
  for (const Checkpoint::TensorRef* r : {&refs.qweight, &refs.qzeros, &refs.scales, &refs.g_idx}) {
    if (r->entry != nullptr) Digest(r->entry->name, *r->entry);
  }
  TANDEM_ASSIGN_OR_RETURN(Int4CheckpointMatrix m,
                          ConvertInt4Checkpoint(ckpt_quant_, refs, shape[0], shape[1], pool()));
  StoreQuantized(std::move(m.matrix), out);
  if (!m.perm.empty()) {  // q/k/v (and gate/up) usually share one permutation: keep one copy
    auto& perms = model_->owned_perms_;
    if (perms.empty() || perms.back() != m.perm) {
      model_->owned_bytes_ += m.perm.size() * sizeof(int32_t);
      perms.push_back(std::move(m.perm));
    }
    out->input_perm = perms.back().data();
  }
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadFp8(const std::string& name, const std::vector<int64_t>& shape,
                                  Tensor* out) {
  const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
  TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef weight, ckpt_->Get(name));
  TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef scale, ckpt_->Get(prefix + ".weight_scale"));
  Digest(name, *weight.entry);
  Digest(scale.entry->name, *scale.entry);
  // The activation scales of fp8 GEMMs: known, not used (fp8_checkpoint.h).
  for (const char* extra : {".input_scale", ".input_scale_ub"}) {
    if (ckpt_->Has(prefix + extra)) used_.insert(prefix + extra);
  }
  TANDEM_ASSIGN_OR_RETURN(QuantizedMatrix m,
                          ConvertFp8Checkpoint(weight, scale, shape[0], shape[1]));
  StoreQuantized(std::move(m), out);
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                                     Tensor* out) {
  if (ckpt_quant_.fp8()) {
    // fp8 projections are F8_E4M3; those the quantizer skipped ("ignore", modules_to_not_convert)
    // are dense and load as the options say.
    TANDEM_ASSIGN_OR_RETURN(Checkpoint::TensorRef ref, ckpt_->Get(name));
    if (ref.entry->dtype == DType::kF8E4M3) return LoadFp8(name, shape, out);
  } else if (ckpt_quant_.quantized()) {
    // Projections the quantizer skipped (modules_to_not_convert, a dense lm_head) stay dense.
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    if (ckpt_->Has(prefix + ".qweight") || !ckpt_->Has(name)) {
      return LoadPacked(prefix, shape, out);
    }
    return LoadDense(name, shape, out);
  }
  if (options_.quantization == WeightQuant::kNone) return LoadDense(name, shape, out);
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, CheckedEntry(name, shape));
  QuantizeInto(e->data, e->dtype, shape[0], shape[1], out);
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadMatrixRows(const std::string& name,
                                         const std::vector<int64_t>& stored_shape,
                                         int64_t row_begin, int64_t N, Tensor* out) {
  if (ckpt_quant_.quantized()) {
    return absl::UnimplementedError(
        absl::StrCat(dir_, ": ", ckpt_quant_.MethodName(), " ", ckpt_quant_.FormatName(),
                     " checkpoints with fused '", name, "' projections are not supported"));
  }
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, CheckedEntry(name, stored_shape));
  const int64_t K = stored_shape[1];
  const uint8_t* src = e->data + static_cast<size_t>(row_begin * K) * DTypeSize(e->dtype);
  if (options_.quantization != WeightQuant::kNone) {
    QuantizeInto(src, e->dtype, N, K, out);
    return absl::OkStatus();
  }
  if (TilesBf16()) {
    TileBf16Into(src, e->dtype, N, K, out);
    return absl::OkStatus();
  }
  const DType dtype = model_->weight_dtype_;
  const size_t elem = DTypeSize(dtype);
  out->dtype = dtype;
  out->shape = {N, K};
  if (options_.map_weights && e->dtype == dtype && reinterpret_cast<uintptr_t>(src) % elem == 0) {
    out->data = src;
    mapped_bytes_ += static_cast<size_t>(N * K) * elem;
    return absl::OkStatus();
  }
  const size_t bytes = static_cast<size_t>(N * K) * elem;
  void* dst = model_->arena_.Allocate(bytes);
  model_->owned_bytes_ += bytes;
  ConvertElements(src, e->dtype, dst, dtype, N * K, pool());
  out->data = dst;
  converted_bytes_ += bytes;
  ++converted_tensors_;
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadNorm(const std::string& name, int64_t dim, Tensor* out) {
  if (!IsGemma(model_->config_.architecture)) {
    return LoadTensor(name, {dim}, DType::kF32, out);
  }
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, CheckedEntry(name, {dim}));
  float* dst = static_cast<float*>(model_->arena_.Allocate(static_cast<size_t>(dim) * 4));
  ConvertElements(e->data, e->dtype, dst, DType::kF32, dim);
  for (int64_t i = 0; i < dim; ++i) dst[i] += 1.0f;  // Gemma3RMSNorm: x * (1 + w), in f32
  model_->owned_bytes_ += static_cast<size_t>(dim) * 4;
  out->dtype = DType::kF32;
  out->shape = {dim};
  out->data = dst;
  return absl::OkStatus();
}

absl::Status ModelLoader::LoadDense(const std::string& name, const std::vector<int64_t>& shape,
                                    Tensor* out) {
  if (!TilesBf16()) return LoadTensor(name, shape, model_->weight_dtype_, out);
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, CheckedEntry(name, shape));
  TileBf16Into(e->data, e->dtype, shape[0], shape[1], out);
  return absl::OkStatus();
}

void ModelLoader::TileBf16Into(const uint8_t* src, DType src_dtype, int64_t N, int64_t K,
                               Tensor* out) {
  std::vector<uint16_t> converted;  // the rows in bf16 when stored otherwise
  const uint16_t* rows = reinterpret_cast<const uint16_t*>(src);
  if (src_dtype != DType::kBF16 || reinterpret_cast<uintptr_t>(src) % 2 != 0) {
    converted.resize(static_cast<size_t>(N * K));
    ConvertElements(src, src_dtype, converted.data(), DType::kBF16, N * K, pool());
    rows = converted.data();
  }
  out->dtype = DType::kBF16;
  out->shape = {N, K};
  out->layout = WeightLayout::kTiles16;
  const size_t bytes = out->stored_bytes();
  auto* tiles = static_cast<uint16_t*>(model_->arena_.Allocate(bytes));
  Bf16ToTiles16(rows, N, K, tiles, pool());
  out->data = tiles;
  model_->owned_bytes_ += bytes;
  converted_bytes_ += bytes;
  ++converted_tensors_;
}

absl::Status ModelLoader::LoadLayer(int64_t i, LayerWeights* l) {
  const ModelConfig& c = model_->config_;
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  const int64_t h = c.hidden_size;
  const int64_t f = c.intermediate_size;
  TANDEM_RETURN_IF_ERROR(LoadNorm(p + "input_layernorm.weight", h, &l->input_norm));
  if (c.architecture == Architecture::kPhi3) {  // qkv_proj: q, k and v rows one after the other
    const std::string qkv = p + "self_attn.qkv_proj.weight";
    const std::vector<int64_t> shape = {q_dim + 2 * kv_dim, h};
    TANDEM_RETURN_IF_ERROR(LoadMatrixRows(qkv, shape, 0, q_dim, &l->q_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrixRows(qkv, shape, q_dim, kv_dim, &l->k_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrixRows(qkv, shape, q_dim + kv_dim, kv_dim, &l->v_proj));
  } else {
    TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "self_attn.q_proj.weight", {q_dim, h}, &l->q_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "self_attn.k_proj.weight", {kv_dim, h}, &l->k_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "self_attn.v_proj.weight", {kv_dim, h}, &l->v_proj));
  }
  if (c.attention_bias) {
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.q_proj.bias", {q_dim}, DType::kF32, &l->q_bias));
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.k_proj.bias", {kv_dim}, DType::kF32, &l->k_bias));
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(p + "self_attn.v_proj.bias", {kv_dim}, DType::kF32, &l->v_bias));
  }
  if (c.qk_norm) {
    TANDEM_RETURN_IF_ERROR(LoadNorm(p + "self_attn.q_norm.weight", c.head_dim, &l->q_norm));
    TANDEM_RETURN_IF_ERROR(LoadNorm(p + "self_attn.k_norm.weight", c.head_dim, &l->k_norm));
  }
  TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "self_attn.o_proj.weight", {h, q_dim}, &l->o_proj));
  TANDEM_RETURN_IF_ERROR(LoadNorm(p + "post_attention_layernorm.weight", h, &l->post_norm));
  if (IsGemma(c.architecture)) {
    TANDEM_RETURN_IF_ERROR(LoadNorm(p + "pre_feedforward_layernorm.weight", h, &l->pre_ffw_norm));
    TANDEM_RETURN_IF_ERROR(LoadNorm(p + "post_feedforward_layernorm.weight", h, &l->post_ffw_norm));
  }
  if (c.num_experts > 0) {
    if (ckpt_quant_.quantized()) {
      return absl::UnimplementedError(
          absl::StrCat(dir_, ": AWQ / GPTQ mixture-of-experts checkpoints are not supported"));
    }
    const bool mixtral = c.architecture == Architecture::kMixtral;
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    const int64_t ef = c.expert_ffn();
    TANDEM_RETURN_IF_ERROR(
        LoadTensor(moe + "gate.weight", {c.num_experts, h}, DType::kF32, &l->router));
    l->experts.resize(static_cast<size_t>(c.num_experts));
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = absl::StrCat(moe, "experts.", e, ".");
      ExpertWeights& ew = l->experts[e];
      TANDEM_RETURN_IF_ERROR(
          LoadMatrix(x + (mixtral ? "w1" : "gate_proj") + ".weight", {ef, h}, &ew.gate_proj));
      TANDEM_RETURN_IF_ERROR(
          LoadMatrix(x + (mixtral ? "w3" : "up_proj") + ".weight", {ef, h}, &ew.up_proj));
      TANDEM_RETURN_IF_ERROR(
          LoadMatrix(x + (mixtral ? "w2" : "down_proj") + ".weight", {h, ef}, &ew.down_proj));
    }
    if (c.shared_expert_intermediate_size > 0) {  // Qwen2-MoE
      const int64_t sf = c.shared_expert_intermediate_size;
      const std::string x = moe + "shared_expert.";
      ExpertWeights& se = l->shared_expert;
      TANDEM_RETURN_IF_ERROR(LoadMatrix(x + "gate_proj.weight", {sf, h}, &se.gate_proj));
      TANDEM_RETURN_IF_ERROR(LoadMatrix(x + "up_proj.weight", {sf, h}, &se.up_proj));
      TANDEM_RETURN_IF_ERROR(LoadMatrix(x + "down_proj.weight", {h, sf}, &se.down_proj));
      TANDEM_RETURN_IF_ERROR(LoadTensor(moe + "shared_expert_gate.weight", {1, h}, DType::kF32,
                                        &l->shared_expert_gate));
    }
    return absl::OkStatus();
  }
  if (c.architecture == Architecture::kPhi3) {  // gate_up_proj: the gate's rows, then up's
    const std::string gate_up = p + "mlp.gate_up_proj.weight";
    TANDEM_RETURN_IF_ERROR(LoadMatrixRows(gate_up, {2 * f, h}, 0, f, &l->gate_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrixRows(gate_up, {2 * f, h}, f, f, &l->up_proj));
  } else {
    TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "mlp.gate_proj.weight", {f, h}, &l->gate_proj));
    TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "mlp.up_proj.weight", {f, h}, &l->up_proj));
  }
  TANDEM_RETURN_IF_ERROR(LoadMatrix(p + "mlp.down_proj.weight", {h, f}, &l->down_proj));
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

std::string ModelLoader::QuantSuffix() const {
  if (ckpt_quant_.quantized()) return ckpt_quant_.IdSuffix();
  switch (options_.quantization) {
    case WeightQuant::kNone:
      break;
    case WeightQuant::kInt8:
      return "-int8";
    case WeightQuant::kInt4:
      return absl::StrCat("-int4g", options_.quant_group_size);
    case WeightQuant::kFp8:
      return "-fp8";
  }
  return "";
}

std::string ModelLoader::ModelId() const {
  const ModelConfig& c = model_->config_;
  Fnv1a digest = digest_;
  digest.Add(ModelConfigToJson(c));
  for (const auto& file : ckpt_->files()) digest.Add(file->header().json);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(digest.value()));
  return absl::StrCat(
      c.model_type, "-L", c.num_layers, "-H", c.hidden_size, "-F", c.intermediate_size, "-A",
      c.num_heads, "x", c.head_dim, "-KV", c.num_kv_heads, "-V", c.vocab_size, "-",
      std::string(DTypeName(model_->weight_dtype_)), QuantSuffix(), "-", std::string(hash, 12));
}

absl::StatusOr<std::unique_ptr<Model>> ModelLoader::Load() {
  const auto start = std::chrono::steady_clock::now();
  model_->dir_ = dir_;
  TANDEM_ASSIGN_OR_RETURN(model_->config_,
                          LoadModelConfig((std::filesystem::path(dir_) / "config.json").string()));
  TANDEM_RETURN_IF_ERROR(MergeGenerationConfig(dir_, &model_->config_));
  TANDEM_ASSIGN_OR_RETURN(ckpt_, Checkpoint::Open(dir_, options_.show_progress));
  TANDEM_RETURN_IF_ERROR(ResolveWeightDType());
  if (options_.quantization == WeightQuant::kInt4 &&
      (options_.quant_group_size < kInt4Chunk ||
       (options_.quant_group_size & (options_.quant_group_size - 1)) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "int4 group size must be a power of two >= 32, got ", options_.quant_group_size));
  }
  model_->quantization_ = options_.quantization;
  // fp8 weights have no tiles (int8 MatMul inputs, the tiles' reader, do not take them).
  model_->quant_layout_ =
      options_.quantization == WeightQuant::kFp8 ? WeightLayout::kRows : options_.quant_layout;
  model_->bf16_layout_ = TilesBf16() ? WeightLayout::kTiles16 : WeightLayout::kRows;
  TANDEM_ASSIGN_OR_RETURN(ckpt_quant_, LoadCheckpointQuantConfig(dir_));
  if (ckpt_quant_.quantized()) {
    // fp8 checkpoints also take --quantization fp8 (their dense projections, e.g. an ignored
    // lm_head, are then quantized at load too).
    const bool fp8_on_fp8 = ckpt_quant_.fp8() && options_.quantization == WeightQuant::kFp8;
    if (options_.quantization != WeightQuant::kNone && !fp8_on_fp8) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, " is already quantized (", ckpt_quant_.MethodName(), " ",
                       ckpt_quant_.FormatName(), ", from ", ckpt_quant_.source, "); quantization ",
                       std::string(WeightQuantName(options_.quantization)),
                       " at load applies to f32/bf16/f16 checkpoints only: use none"));
    }
    model_->quantization_ = ckpt_quant_.fp8() ? WeightQuant::kFp8 : WeightQuant::kInt4;
    if (ckpt_quant_.fp8()) model_->quant_layout_ = WeightLayout::kRows;
    model_->checkpoint_quant_ = ckpt_quant_;
  }

  const ModelConfig& c = model_->config_;
  ModelWeights& w = model_->weights_;
  const DType wt = model_->weight_dtype_;
  TANDEM_RETURN_IF_ERROR(
      LoadTensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, wt, &w.embed_tokens));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    TANDEM_RETURN_IF_ERROR(LoadLayer(i, &w.layers[i]));
  }
  TANDEM_RETURN_IF_ERROR(LoadNorm("model.norm.weight", c.hidden_size, &w.final_norm));
  if (c.tie_word_embeddings) {
    if (options_.quantization == WeightQuant::kNone && !TilesBf16()) {
      w.lm_head = w.embed_tokens;
    } else if (options_.quantization == WeightQuant::kNone) {  // lookups stay on the rows
      TileBf16Into(static_cast<const uint8_t*>(w.embed_tokens.data), wt, c.vocab_size,
                   c.hidden_size, &w.lm_head);
    } else {  // the embedding table stays dense for lookups; lm_head gets a quantized copy
      QuantizeInto(static_cast<const uint8_t*>(w.embed_tokens.data), wt, c.vocab_size,
                   c.hidden_size, &w.lm_head);
    }
  } else {
    TANDEM_RETURN_IF_ERROR(LoadMatrix("lm_head.weight", {c.vocab_size, c.hidden_size}, &w.lm_head));
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
               << " MiB converted, weights " << DTypeName(wt)
               << (options_.quantization == WeightQuant::kNone
                       ? std::string()
                       : absl::StrCat(", quantized ",
                                      std::string(WeightQuantName(options_.quantization))))
               << (ckpt_quant_.quantized() ? absl::StrCat(", ", ckpt_quant_.MethodName(), " ",
                                                          ckpt_quant_.FormatName(), " checkpoint")
                                           : std::string())
               << ")";
  }
  return std::move(model_);
}

size_t Model::decode_weight_bytes() const {
  const ModelWeights& w = weights_;
  size_t bytes = w.lm_head.stored_bytes() +
                 static_cast<size_t>(config_.hidden_size) * DTypeSize(w.embed_tokens.dtype);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      if (!t->empty()) bytes += t->stored_bytes();  // MoE layers have no dense gate/up/down
    }
    // Experts: one token reads the router and its num_experts_per_tok experts.
    if (!l.experts.empty()) {
      bytes += l.router.stored_bytes();
      const ExpertWeights& e = l.experts[0];
      bytes += static_cast<size_t>(config_.num_experts_per_tok) *
               (e.gate_proj.stored_bytes() + e.up_proj.stored_bytes() + e.down_proj.stored_bytes());
      // Qwen2-MoE: every token also reads the shared expert and its gate.
      const ExpertWeights& se = l.shared_expert;
      for (const Tensor* t : {&se.gate_proj, &se.up_proj, &se.down_proj, &l.shared_expert_gate}) {
        if (!t->empty()) bytes += t->stored_bytes();
      }
    }
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir,
                                                 const LoadOptions& options) {
  return ModelLoader(dir, options).Load();
}

}  // namespace tandem
