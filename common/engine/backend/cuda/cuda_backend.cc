// CUDA backend: creation, device memory (weights, KV pool, step buffers) and KV block access.
// The forward pass and CUDA graphs live in cuda_forward.cc.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/kv_layout.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/backend/cuda/fp8_gemm.h"
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

void* CudaKvLayerReadyEvent(Backend* backend, int64_t layer) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend);
  return cuda == nullptr ? nullptr : cuda->KvLayerReadyEvent(layer);
}

namespace cuda {
namespace {

constexpr int64_t kMaxRopePositions = 1 << 17;
constexpr int64_t kStackRows = 64;  // bf16 split GEMMs of up to this many rows: one GEMM
constexpr int kMaxTileRows = 64;    // attention tile rows (tokens * group)
constexpr size_t kAttentionSmemBudget = 96 * 1024;
constexpr int kPartialSlots = 256;  // tokens whose attention may be split per step
// Device memory left free beyond the pool for graphs, cuBLAS and the CUDA context's growth.
constexpr size_t kHeadroomBytes = size_t{256} << 20;

// Graph token-count buckets: 1, 2, 4, 8, then by 8 to 256, by 16 to 512, by 32 beyond, and
// `max` (at most 12.5% padding above 8 tokens, 3% above 256).
std::vector<int> GraphBuckets(int64_t max) {
  std::vector<int> buckets;
  int b = 1;
  while (b <= max) {
    buckets.push_back(b);
    b += b < 8 ? b : (b < 256 ? 8 : (b < 512 ? 16 : 32));
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
  block_staging_.reset();
  for (StepSlot& slot : slots_) {
    if (slot.done != nullptr) cudaEventDestroy(slot.done);
  }
  DropGraphs();
  gemm_.reset();
  for (cudaEvent_t e : layer_events_) cudaEventDestroy(e);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::shared_ptr<const Model> model, const CudaBackendOptions& options) {
  if (options.block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (!IsKvDType(options.kv_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA KV cache dtype must be f32, bf16, int8 or fp8 (e4m3), got ",
                     std::string(DTypeName(options.kv_dtype))));
  }
  if (options.num_blocks <= 0 && options.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError("kv_cache_bytes must be >= 0");
  }
  if (options.num_blocks <= 0 &&
      !(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("gpu_memory_utilization must be in (0, 1], got ",
                                                   options.gpu_memory_utilization));
  }
  // int8, int4 and fp8 (made at load, or AWQ / GPTQ / fp8 as loaded) weight-only quantization in
  // row layout; DeviceWeights::CheckQuantized names what else is refused.
  TANDEM_RETURN_IF_ERROR(DeviceWeights::CheckQuantized(*model));
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
  for (StepSlot& slot : slots_) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags");
  }
  layer_events_.assign(c.num_layers, nullptr);  // before anyone can ask (KvLayerReadyEvent)
  for (cudaEvent_t& e : layer_events_) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags (kv layer)");
  }
  gemm_ = std::make_unique<Gemm>();
  TANDEM_RETURN_IF_ERROR(gemm_->Init(stream_));
  TANDEM_RETURN_IF_ERROR(SetUpFp8Gemm(options_, *model_, *gemm_));
  auto weights = DeviceWeights::Upload(*model_);
  if (!weights.ok()) return weights.status();
  weights_ = std::move(weights).value();
  act_bf16_ = options_.bf16_activations && model_->weight_dtype() == DType::kBF16;

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
  table_width_ = (max_positions_ + spec_.block_size - 1) / spec_.block_size;

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
  plan_options_.max_partial_slots = kPartialSlots;
  const size_t slots = static_cast<size_t>(plan_options_.max_partial_slots) * kMaxAttentionSplits *
                       static_cast<size_t>(c.num_heads);
  TANDEM_RETURN_IF_ERROR(
      partial_.Allocate(slots * (c.head_dim + 2) * sizeof(float), "attention split buffers"));

  if (options_.cuda_graphs) buckets_ = GraphBuckets(options_.max_graph_tokens);
  const int64_t graph_tokens = buckets_.empty() ? 0 : buckets_.back();
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(std::max(options_.max_num_tokens, graph_tokens),
                                        std::max(options_.max_num_seqs, graph_tokens),
                                        std::max(options_.max_num_seqs, graph_tokens)));
  if (options_.lora_slots > 0) {  // before the KV pool takes what is left
    DeviceLoraOptions lora;
    lora.slots = options_.lora_slots;
    lora.max_rank = options_.lora_max_rank;
    lora.dtype = options_.lora_dtype;
    lora.max_tokens = cap_tokens_;
    auto made = DeviceLora::Create(c, lora);
    if (!made.ok()) return made.status();
    lora_ = std::move(made).value();
  }
  TANDEM_RETURN_IF_ERROR(AllocateKvPool());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (init)");
  const absl::Time start = absl::Now();
  if (absl::Status st = CaptureGraphs(); !st.ok()) {
    TLOG(WARNING) << "CUDA graphs disabled, every step runs eagerly: " << st;
    graphs_enabled_ = false;
    DropGraphs();
  }
  TLOG(INFO) << "CUDA backend on " << CudaDeviceDescription(options_.device) << ": weights "
             << weights_->bytes() / (1 << 20) << " MiB, "
             << (act_bf16_                                ? "bf16 activations"
                 : model_->weight_dtype() == DType::kBF16 ? "f32 activations (parity mode)"
                                                          : "f32 activations")
             << ", KV pool " << spec_.num_blocks << " blocks (" << kv_.bytes() / (1 << 20)
             << " MiB)"
             << (lora_ != nullptr ? absl::StrCat(", LoRA ", lora_->options().slots,
                                                 " adapters of rank ", lora_->options().max_rank,
                                                 " (", lora_->reserved_bytes() / (1 << 20), " MiB)")
                                  : std::string())
             << ", attention tiles of " << tile_tokens << " tokens, " << graphs_captured()
             << " CUDA graphs for steps of up to " << graph_tokens << " tokens captured in "
             << absl::ToInt64Milliseconds(absl::Now() - start) << " ms";
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckLora(int64_t max_loras, int64_t max_rank, DType dtype) const {
  if (lora_ == nullptr) {
    return absl::FailedPreconditionError(
        "no device memory was reserved for adapters (CudaBackendOptions::lora_slots)");
  }
  const DeviceLoraOptions& o = lora_->options();
  if (max_loras > o.slots || max_rank > o.max_rank || DTypeSize(dtype) > DTypeSize(o.dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the device holds ", o.slots, " adapters of rank ", o.max_rank, " in ",
                     std::string(DTypeName(o.dtype)), ", the engine may run ", max_loras,
                     " of rank ", max_rank, " in ", std::string(DTypeName(dtype))));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateKvPool() {
  const size_t per_block = spec_.bytes_per_block();
  int64_t blocks = options_.num_blocks;
  if (blocks <= 0) {
    size_t free = 0, total = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    const double gib = 1 << 30;
    const double allowed = options_.gpu_memory_utilization * static_cast<double>(total);
    const double used = static_cast<double>(total - free);
    const double budget = allowed - used - static_cast<double>(kHeadroomBytes);
    if (options_.kv_cache_bytes > 0) {
      blocks = options_.kv_cache_bytes / static_cast<int64_t>(per_block);
      if (blocks < 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "KV cache budget (--kv-cache-memory) of %d bytes holds no block of %d bytes",
            options_.kv_cache_bytes, per_block));
      }
      if (static_cast<double>(blocks * per_block) > budget) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "--kv-cache-memory %.2f GiB does not fit in --gpu-memory-utilization %.2f of this "
            "device's %.2f GiB (%.2f GiB): weights, buffers and the CUDA context already use "
            "%.2f GiB, %.2f GiB is kept free; at most %.2f GiB is left for the KV cache",
            static_cast<double>(options_.kv_cache_bytes) / gib, options_.gpu_memory_utilization,
            static_cast<double>(total) / gib, allowed / gib, used / gib, kHeadroomBytes / gib,
            std::max(0.0, budget) / gib));
      }
    } else {
      blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(per_block)) : 0;
      if (blocks < 1) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "no device memory left for the KV cache: %.2f GiB allowed (gpu_memory_utilization "
            "%.2f of %.2f GiB), %.2f GiB already in use (weights %.2f GiB), one block needs %d "
            "bytes",
            allowed / gib, options_.gpu_memory_utilization, static_cast<double>(total) / gib,
            used / gib, static_cast<double>(weights_->bytes()) / gib, per_block));
      }
    }
    blocks = std::min<int64_t>(blocks, INT32_MAX / 2);
  }
  spec_.num_blocks = blocks;
  TANDEM_RETURN_IF_ERROR(kv_.Allocate(per_block * static_cast<size_t>(blocks), "KV cache"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_.get(), 0, kv_.bytes(), stream_),
                              "cudaMemsetAsync (KV cache)");
  return absl::OkStatus();
}

int64_t CudaBackend::ItemsCapacity(int64_t tokens) const {
  // Every tile holds at least one token; a split tile of n tokens takes n partial slots and makes
  // at most kMaxAttentionSplits items.
  return tokens +
         std::min<int64_t>(tokens, plan_options_.max_partial_slots) * (kMaxAttentionSplits - 1);
}

CudaBackend::InputLayout CudaBackend::Layout(int64_t tokens) const {
  InputLayout L;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += AlignUp256(bytes);
    return start;
  };
  L.counts = take(sizeof(AttentionCounts));
  L.rows = take(cap_rows_ * sizeof(int32_t));
  L.tokens = take(tokens * sizeof(int32_t));
  L.positions = take(tokens * sizeof(int32_t));
  L.context_lens = take(tokens * sizeof(int32_t));
  L.slots = take(tokens * sizeof(int64_t));
  L.items = take(ItemsCapacity(tokens) * sizeof(AttentionItem));
  L.combines =
      take(std::min<int64_t>(tokens, plan_options_.max_partial_slots) * sizeof(CombineItem));
  L.tables = at;
  return L;
}

absl::Status CudaBackend::EnsureCapacity(int64_t tokens, int64_t seqs, int64_t logit_rows) {
  if (tokens <= cap_tokens_ && seqs <= cap_seqs_ && logit_rows <= cap_rows_) {
    return absl::OkStatus();
  }
  graphs_stale_ = !body_graphs_.empty() || !head_graphs_.empty();
  DropGraphs();  // they point into the buffers reallocated below
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (grow)");
  cap_tokens_ = std::max(cap_tokens_, tokens);
  cap_seqs_ = std::max(cap_seqs_, seqs);
  cap_rows_ = std::max(cap_rows_, logit_rows);
  const ModelConfig& c = model_->config();
  const int64_t d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const size_t act = act_bf16_ ? sizeof(uint16_t) : sizeof(float);

  // Activations, zeroed once: rows past a step's tokens in a graph's bucket are computed from
  // whatever they hold, which must be finite.
  size_t offset = 0;
  std::vector<std::pair<void**, size_t>> regions = {
      {reinterpret_cast<void**>(&x_), cap_tokens_ * d * sizeof(float)},
      {reinterpret_cast<void**>(&delta_), cap_tokens_ * d * sizeof(float)},
      {reinterpret_cast<void**>(&qkv_), cap_tokens_ * (qd + 2 * kvd) * sizeof(float)},
      {reinterpret_cast<void**>(&gate_up_), cap_tokens_ * 2 * f * sizeof(float)},
      {reinterpret_cast<void**>(&logits_), cap_rows_ * v * sizeof(float)},
      {&h_, cap_tokens_ * d * act},
      {&attn_, cap_tokens_ * qd * act},
      {&mlp_, cap_tokens_ * f * act},
      {&rows_norm_, cap_rows_ * d * act}};
  std::vector<size_t> offsets;
  for (const auto& [ptr, bytes] : regions) {
    offsets.push_back(offset);
    offset += AlignUp256(bytes);
  }
  TANDEM_RETURN_IF_ERROR(activations_.Allocate(offset, "activations"));
  for (size_t i = 0; i < regions.size(); ++i) {
    *regions[i].first = activations_.as<uint8_t>() + offsets[i];
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(activations_.get(), 0, offset, stream_),
                              "cudaMemsetAsync (activations)");

  // Scratch of the split products (f32 activations, bf16 weights, above kGemvMaxRows rows).
  const bool split = !act_bf16_ && model_->weight_dtype() == DType::kBF16;
  const int64_t kmax = std::max({d, qd, f});
  const int64_t nmax = std::max({v, 2 * f, qd + 2 * kvd, d});
  const int64_t split_elems = split ? 2 * std::max(cap_tokens_, cap_rows_) * kmax : 0;
  const int64_t stacked = split ? 2 * kStackRows * nmax : 0;
  const size_t split_bytes = AlignUp256(split_elems * sizeof(uint16_t));
  TANDEM_RETURN_IF_ERROR(
      gemm_scratch_.Allocate(split_bytes + stacked * sizeof(float), "matmul scratch"));
  gemm_->SetScratch(gemm_scratch_.as<uint16_t>(), split_elems,
                    reinterpret_cast<float*>(gemm_scratch_.as<uint8_t>() + split_bytes),
                    split ? kStackRows : 0, nmax);
  TANDEM_RETURN_IF_ERROR(gemm_->ReserveFp8(std::max(cap_tokens_, cap_rows_), kmax));

  // Per-step inputs: the largest layout, with the block tables of every sequence at full width.
  const size_t total =
      Layout(cap_tokens_).tables + static_cast<size_t>(cap_seqs_ * table_width_) * sizeof(int32_t);
  // Then the (token, sample) pairs of input tokens gathered from the previous step's samples.
  input_bytes_ = AlignUp256(total) + AlignUp256(cap_tokens_ * 2 * sizeof(int32_t));
  TANDEM_RETURN_IF_ERROR(inputs_.Allocate(input_bytes_, "step inputs"));
  // The slots' pinned buffers grow when a step next stages into them (PrepareSlot): a slot whose
  // step is launched keeps what comes back to it.
  return absl::OkStatus();
}

KvLayerView CudaBackend::KvLayer(int64_t layer) const {
  KvLayerView kv;
  kv.base = Region(layer, 0);
  kv.dtype = spec_.dtype;
  kv.block_size = static_cast<int32_t>(spec_.block_size);
  kv.num_kv_heads = static_cast<int32_t>(spec_.num_kv_heads);
  kv.head_dim = static_cast<int32_t>(spec_.head_dim);
  if (step_remote_ != nullptr) kv.remote_base = step_remote_->layer_base[layer];
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

BlockStaging& CudaBackend::Staging() {
  if (block_staging_ == nullptr) {
    block_staging_ = std::make_unique<BlockStaging>(
        stream_, spec_.num_layers, spec_.bytes_per_block_layer(),
        static_cast<size_t>(std::max<int64_t>(0, options_.block_staging_bytes)),
        [this](int64_t layer, int32_t block) { return Region(layer, block); });
  }
  return *block_staging_;
}

absl::StatusOr<HostMemory> CudaBackend::AllocateHostMemory(size_t bytes) {
  cudaSetDevice(options_.device);
  return Staging().AllocatePinned(bytes);
}

std::optional<uint64_t> CudaBackend::StartBlockRead(int32_t block, uint8_t* dst) {
  if (block < 0 || block >= spec_.num_blocks) return std::nullopt;
  cudaSetDevice(options_.device);
  return Staging().StartRead(block, dst);
}

std::optional<uint64_t> CudaBackend::StartBlockWrite(int32_t block, const uint8_t* src) {
  if (block < 0 || block >= spec_.num_blocks) return std::nullopt;
  cudaSetDevice(options_.device);
  return Staging().StartWrite(block, src);
}

absl::StatusOr<bool> CudaBackend::PollBlockCopy(uint64_t ticket, bool wait) {
  cudaSetDevice(options_.device);
  return Staging().Poll(ticket, wait);
}

}  // namespace cuda
}  // namespace tandem
