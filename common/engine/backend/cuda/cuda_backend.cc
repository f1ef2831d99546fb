// CUDA backend: creation, device memory (weights, KV pool, step buffers) and KV block access.
// The forward pass and CUDA graphs live in cuda_forward.cc.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/model/rope.h"

namespace tandem {

bool CudaDeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error state
    if (why != nullptr) {
      *why = absl::StrCat("no usable CUDA driver or device (cudaGetDeviceCount: ",
                          cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
    }
    return false;
  }
  if (count == 0) {
    if (why != nullptr)
      *why = "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)";
    return false;
  }
  return true;
}

std::string CudaDeviceDescription(int device) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("device ", device, " (", cudaGetErrorString(err), ")");
  }
  return absl::StrFormat("%s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major, prop.minor,
                         prop.multiProcessorCount,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(std::shared_ptr<const Model> model,
                                                           const CudaBackendOptions& options) {
  auto backend = cuda::CudaBackend::Create(std::move(model), options);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(backend).value());
}

uint8_t* CudaDeviceBlockRegion(Backend* backend, int64_t layer, int32_t block) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend);
  if (cuda == nullptr) return nullptr;
  const KvCacheSpec& spec = cuda->kv_spec();
  if (layer < 0 || layer >= spec.num_layers || block < 0 || block >= spec.num_blocks) {
    return nullptr;
  }
  return cuda->DeviceBlockRegion(layer, block);
}

namespace cuda {
namespace {

constexpr int64_t kMaxRopePositions = 1 << 17;
constexpr int64_t kStackRows = 64;  // bf16 split GEMMs of up to this many rows: one GEMM
constexpr int kMaxTileRows = 64;    // attention tile rows (tokens * group)
constexpr size_t kAttentionSmemBudget = 96 * 1024;
constexpr int64_t kMinPartialSlots = 256;  // tokens whose attention may be split per step
// Device memory left free beyond the pool for graphs, cuBLAS and the CUDA context's growth.
constexpr size_t kHeadroomBytes = size_t{256} << 20;

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Decode graph batch sizes: 1, 2, 4, 8, then by 8 to 64, by 16 to 128, by 32 beyond, and `max`.
std::vector<int> GraphBatchBuckets(int64_t max) {
  std::vector<int> buckets;
  int b = 1;
  while (b <= max) {
    buckets.push_back(b);
    b += b < 8 ? b : (b < 64 ? 8 : (b < 128 ? 16 : 32));
  }
  if (max > 0 && buckets.back() != max) buckets.push_back(static_cast<int>(max));
  return buckets;
}

}  // namespace

CudaBackend::CudaBackend(std::shared_ptr<const Model> model, const CudaBackendOptions& options)
    : model_(std::move(model)), options_(options) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  DropGraphs();
  gemm_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::shared_ptr<const Model> model, const CudaBackendOptions& options) {
  if (options.block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (options.kv_dtype != DType::kF32 && options.kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA KV cache dtype must be f32 or bf16, got ",
                                                   std::string(DTypeName(options.kv_dtype))));
  }
  if (options.num_blocks <= 0 &&
      !(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("gpu_memory_utilization must be in (0, 1], got ",
                                                   options.gpu_memory_utilization));
  }
  if (model->quantization() != WeightQuant::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend serves dense weights only; this model is quantized (",
                     std::string(WeightQuantName(model->quantization())), ")"));
  }
  if (const ModelConfig& c = model->config();
      c.qk_norm || IsGemma(c.architecture) || c.num_experts > 0 || c.rope_dim() != c.head_dim) {
    return absl::UnimplementedError(
        absl::StrCat("the CUDA backend does not implement ", c.architecture_name,
                     " yet (per-head q/k norms, Gemma's norms, GeGLU and soft-capping, experts, "
                     "partial rotary embeddings); serve it "
                     "with --device cpu"));
  }
  std::string why;
  if (!CudaDeviceAvailable(&why)) return absl::FailedPreconditionError(why);
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(model), options));
  if (auto st = backend->Init(); !st.ok()) return st;
  return backend;
}

absl::Status CudaBackend::Init() {
  const ModelConfig& c = model_->config();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                              absl::StrCat("cudaSetDevice(", options_.device, ")"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags");
  gemm_ = std::make_unique<Gemm>();
  TANDEM_RETURN_IF_ERROR(
      gemm_->Init(stream_, options_.bf16_activations ? Bf16Mode::kRound : Bf16Mode::kSplit));
  auto weights = DeviceWeights::Upload(*model_);
  if (!weights.ok()) return weights.status();
  weights_ = std::move(weights).value();

  max_positions_ = std::min<int64_t>(c.max_position_embeddings, kMaxRopePositions);
  if (options_.max_model_len > 0) max_positions_ = std::min(max_positions_, options_.max_model_len);
  const std::vector<float> rope = RopeCosSinTable(c, max_positions_);
  TANDEM_RETURN_IF_ERROR(rope_.Allocate(rope.size() * sizeof(float), "RoPE table"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope_.get(), rope.data(), rope.size() * sizeof(float), cudaMemcpyHostToDevice),
      "cudaMemcpy (RoPE table)");

  spec_.num_layers = c.num_layers;
  spec_.num_kv_heads = c.num_kv_heads;
  spec_.head_dim = c.head_dim;
  spec_.block_size = options_.block_size;
  spec_.dtype = options_.kv_dtype;
  table_width_ = (NextPow2(max_positions_) + spec_.block_size - 1) / spec_.block_size;

  // Attention tiles: as many tokens as fit the rows cap and the shared-memory budget.
  const int group = static_cast<int>(c.num_heads / c.num_kv_heads);
  int optin = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, options_.device),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  const size_t budget = std::min<size_t>(kAttentionSmemBudget, static_cast<size_t>(optin));
  const int hd = static_cast<int>(c.head_dim);
  int tile_tokens = std::max(1, kMaxTileRows / group);
  while (tile_tokens > 1 && AttentionSharedBytes(tile_tokens * group, hd) > budget) --tile_tokens;
  if (AttentionSharedBytes(group, hd) > budget) {
    return absl::UnimplementedError(absl::StrCat("attention tile of ", group, " heads x head_dim ",
                                                 hd, " exceeds ", budget,
                                                 " bytes of shared memory"));
  }
  // The whole budget, not this model's need: the attribute is per kernel and process-wide, and
  // another backend in the process may need more.
  TANDEM_CUDA_RETURN_IF_ERROR(ConfigureAttention(budget),
                              "cudaFuncSetAttribute (attention shared memory)");
  int sms = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options_.device),
      "cudaDeviceGetAttribute(MultiProcessorCount)");
  plan_options_.group = group;
  plan_options_.kv_heads = static_cast<int>(c.num_kv_heads);
  plan_options_.target_blocks = 2 * sms;
  plan_options_.max_tile_tokens = tile_tokens;
  plan_options_.max_partial_slots =
      static_cast<int>(std::max<int64_t>(kMinPartialSlots, options_.max_graph_batch));
  const size_t slots = static_cast<size_t>(plan_options_.max_partial_slots) * kMaxAttentionSplits *
                       static_cast<size_t>(c.num_heads);
  TANDEM_RETURN_IF_ERROR(
      partial_.Allocate(slots * (c.head_dim + 2) * sizeof(float), "attention split buffers"));

  batch_buckets_ = GraphBatchBuckets(options_.max_graph_batch);
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(std::max(options_.max_num_tokens, options_.max_graph_batch),
                                        std::max(options_.max_num_seqs, options_.max_graph_batch),
                                        std::max(options_.max_num_seqs, options_.max_graph_batch)));
  TANDEM_RETURN_IF_ERROR(AllocateKvPool());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (init)");
  TLOG(INFO) << "CUDA backend on " << CudaDeviceDescription(options_.device) << ": weights "
             << weights_->bytes() / (1 << 20) << " MiB, KV pool " << spec_.num_blocks << " blocks ("
             << kv_.bytes() / (1 << 20) << " MiB), attention tiles of " << tile_tokens << " tokens";
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateKvPool() {
  const size_t per_block = spec_.bytes_per_block();
  int64_t blocks = options_.num_blocks;
  if (blocks <= 0) {
    size_t free = 0, total = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    const double allowed = options_.gpu_memory_utilization * static_cast<double>(total);
    const double used = static_cast<double>(total - free);
    const double budget = allowed - used - static_cast<double>(kHeadroomBytes);
    blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(per_block)) : 0;
    blocks = std::min<int64_t>(blocks, INT32_MAX / 2);
    if (blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no device memory left for the KV cache: %.2f GiB allowed (gpu_memory_utilization "
          "%.2f of %.2f GiB), %.2f GiB already in use (weights %.2f GiB), one block needs %d "
          "bytes",
          allowed / (1 << 30), options_.gpu_memory_utilization,
          static_cast<double>(total) / (1 << 30), used / (1 << 30),
          static_cast<double>(weights_->bytes()) / (1 << 30), per_block));
    }
  }
  spec_.num_blocks = blocks;
  TANDEM_RETURN_IF_ERROR(kv_.Allocate(per_block * static_cast<size_t>(blocks), "KV cache"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_.get(), 0, kv_.bytes(), stream_),
                              "cudaMemsetAsync (KV cache)");
  return absl::OkStatus();
}

absl::Status CudaBackend::EnsureCapacity(int64_t tokens, int64_t seqs, int64_t logit_rows) {
  if (tokens <= cap_tokens_ && seqs <= cap_seqs_ && logit_rows <= cap_rows_)
    return absl::OkStatus();
  DropGraphs();  // they point into the buffers reallocated below
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (grow)");
  cap_tokens_ = std::max(cap_tokens_, tokens);
  cap_seqs_ = std::max(cap_seqs_, seqs);
  cap_rows_ = std::max(cap_rows_, logit_rows);
  const ModelConfig& c = model_->config();
  const int64_t d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;

  // Activations.
  size_t offset = 0;
  std::vector<std::pair<float**, size_t>> regions = {
      {&x_, cap_tokens_ * d},        {&h_, cap_tokens_ * d},
      {&delta_, cap_tokens_ * d},    {&qkv_, cap_tokens_ * (qd + 2 * kvd)},
      {&attn_, cap_tokens_ * qd},    {&gate_up_, cap_tokens_ * 2 * f},
      {&mlp_, cap_tokens_ * f},      {&rows_x_, cap_rows_ * d},
      {&rows_delta_, cap_rows_ * d}, {&rows_norm_, cap_rows_ * d},
      {&logits_, cap_rows_ * v}};
  std::vector<size_t> offsets;
  for (const auto& [ptr, count] : regions) {
    offsets.push_back(offset);
    offset += AlignUp256(count * sizeof(float));
  }
  TANDEM_RETURN_IF_ERROR(activations_.Allocate(offset, "activations"));
  for (size_t i = 0; i < regions.size(); ++i) {
    *regions[i].first = reinterpret_cast<float*>(activations_.as<uint8_t>() + offsets[i]);
  }

  // Scratch of the bf16 products.
  const int64_t kmax = std::max({d, qd, f});
  const int64_t nmax = std::max({v, 2 * f, qd + 2 * kvd, d});
  const bool split = gemm_->mode() == Bf16Mode::kSplit;
  const int64_t split_elems = (split ? 2 : 1) * std::max(cap_tokens_, cap_rows_) * kmax;
  const int64_t stacked = split ? 2 * kStackRows * nmax : 0;
  const size_t split_bytes = AlignUp256(split_elems * sizeof(uint16_t));
  TANDEM_RETURN_IF_ERROR(
      gemm_scratch_.Allocate(split_bytes + stacked * sizeof(float), "matmul scratch"));
  gemm_->SetScratch(gemm_scratch_.as<uint16_t>(), split_elems,
                    reinterpret_cast<float*>(gemm_scratch_.as<uint8_t>() + split_bytes),
                    split ? kStackRows : 0, nmax);

  // Per-step inputs.
  cap_items_ =
      cap_tokens_ + static_cast<int64_t>(plan_options_.max_partial_slots) * kMaxAttentionSplits;
  InputLayout& L = layout_;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += AlignUp256(bytes);
    return start;
  };
  L.tokens = take(cap_tokens_ * sizeof(int32_t));
  L.positions = take(cap_tokens_ * sizeof(int32_t));
  L.context_lens = take(cap_tokens_ * sizeof(int32_t));
  L.logit_rows = take(cap_rows_ * sizeof(int32_t));
  L.slots = take(cap_tokens_ * sizeof(int64_t));
  L.head_end = at;
  L.tables = take(static_cast<size_t>(cap_seqs_ * table_width_) * sizeof(int32_t));
  L.items = take(cap_items_ * sizeof(AttentionItem));
  L.combines = take(static_cast<size_t>(plan_options_.max_partial_slots) * sizeof(CombineItem));
  L.total = at;
  TANDEM_RETURN_IF_ERROR(inputs_.Allocate(L.total, "step inputs"));
  TANDEM_RETURN_IF_ERROR(staging_.Allocate(L.total, "step input staging"));
  TANDEM_RETURN_IF_ERROR(logits_host_.Allocate(cap_rows_ * v * sizeof(float), "logits staging"));
  return absl::OkStatus();
}

KvLayerView CudaBackend::KvLayer(int64_t layer) const {
  KvLayerView kv;
  kv.base = Region(layer, 0);
  kv.is_bf16 = spec_.dtype == DType::kBF16;
  kv.block_size = static_cast<int32_t>(spec_.block_size);
  kv.num_kv_heads = static_cast<int32_t>(spec_.num_kv_heads);
  kv.head_dim = static_cast<int32_t>(spec_.head_dim);
  return kv;
}

uint8_t* CudaBackend::Region(int64_t layer, int32_t block) const {
  return kv_.as<uint8_t>() +
         (static_cast<size_t>(layer) * static_cast<size_t>(spec_.num_blocks) + block) *
             spec_.bytes_per_block_layer();
}

void CudaBackend::CopyBlock(int32_t src, int32_t dst) {
  if (!sticky_.ok()) return;
  if (src < 0 || src >= spec_.num_blocks || dst < 0 || dst >= spec_.num_blocks) {
    sticky_ = absl::OutOfRangeError(absl::StrCat("CopyBlock(", src, ", ", dst, ") out of range"));
    return;
  }
  cudaSetDevice(options_.device);
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    const cudaError_t err =
        cudaMemcpyAsync(Region(l, dst), Region(l, src), spec_.bytes_per_block_layer(),
                        cudaMemcpyDeviceToDevice, stream_);
    if (err != cudaSuccess) {
      sticky_ = CudaStatus(err, "cudaMemcpyAsync (CopyBlock)");
      TLOG(ERROR) << sticky_;
      return;
    }
  }
}

absl::Status CudaBackend::ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) {
  if (layer < 0 || layer >= spec_.num_layers || block < 0 || block >= spec_.num_blocks) {
    return absl::OutOfRangeError(absl::StrCat("KV region (", layer, ", ", block, ") out of range"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, Region(layer, block), spec_.bytes_per_block_layer(),
                      cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (ReadBlockRegion)");
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_),
                              "cudaStreamSynchronize (ReadBlockRegion)");
  return absl::OkStatus();
}

absl::Status CudaBackend::WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) {
  if (layer < 0 || layer >= spec_.num_layers || block < 0 || block >= spec_.num_blocks) {
    return absl::OutOfRangeError(absl::StrCat("KV region (", layer, ", ", block, ") out of range"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(Region(layer, block), src, spec_.bytes_per_block_layer(),
                      cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (WriteBlockRegion)");
  // The source is pageable caller memory: wait before the caller may reuse it.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_),
                              "cudaStreamSynchronize (WriteBlockRegion)");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace tandem
