#include "common/engine/backend/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/cpu_features.h"
#include "common/base/half.h"
#include "common/base/log.h"
#include "common/engine/backend/cpu/weight_view.h"
#include "common/engine/model/rope.h"

namespace tandem {
namespace {

constexpr int64_t kMaxRopePositions = 1 << 17;

// Commits [p, p + bytes) page by page on the pool's threads: MADV_POPULATE_WRITE (Linux 5.14+;
// fails with ENOMEM instead of waking the OOM killer), else one write per 4 KiB page.
absl::Status CommitPages(uint8_t* p, size_t bytes, ThreadPool* pool) {
  constexpr int64_t kChunk = int64_t{2} << 20;  // one huge page
  constexpr int kPopulateWrite = 23;            // MADV_POPULATE_WRITE (glibc 2.36 lacks it)
  std::atomic<int> error{0};
  pool->ParallelForGrain(static_cast<int64_t>(bytes), kChunk, [&](int64_t begin, int64_t end) {
    if (error.load(std::memory_order_relaxed) != 0) return;
    if (::madvise(p + begin, static_cast<size_t>(end - begin), kPopulateWrite) == 0) return;
    if (errno != EINVAL) {
      error.store(errno, std::memory_order_relaxed);
      return;
    }
    for (int64_t o = begin; o < end; o += 4096) static_cast<volatile uint8_t*>(p)[o] = 0;
  });
  if (error.load() != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot commit the ", bytes >> 20, " MiB KV pool: ", std::strerror(error.load())));
  }
  return absl::OkStatus();
}

template <typename T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

cpu::MatMulWeight View(const Tensor& t, DType input_dtype) { return WeightView(t, input_dtype); }

// out[m, j] = x[m, perm[j]] for m < M, j < K (x row stride ldx, out contiguous).
void Gather(const float* x, int64_t M, int64_t K, int64_t ldx, const int32_t* perm, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * ldx;
    float* dst = out + m * K;
    for (int64_t j = 0; j < K; ++j) dst[j] = row[perm[j]];
  }
}

// x[i] *= s for i < n.
void ScaleRows(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// Gemma's embedding scale sqrt(hidden) in the embeddings' dtype, as transformers makes it
// (torch.tensor(hidden ** 0.5, dtype=hidden_states.dtype)): rounded to bf16 for bf16 weights.
float EmbeddingScale(const ModelConfig& c, DType dtype) {
  const float s = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  return dtype == DType::kBF16 ? Bf16ToFloat(FloatToBf16(s)) : s;
}

// out[i] = gelu_tanh(gate[i]) * up[i] for i < n, GELU's tanh approximation
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (gelu_pytorch_tanh). Elementwise, so any split
// over the pool gives the same bits.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out, ThreadPool* pool) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  pool->ParallelForGrain(n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = 0.5f * g * (1.0f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
    }
  });
}

}  // namespace

size_t CpuBackend::KvBytesPerBlock(const ModelConfig& config, int64_t block_size, DType kv_dtype,
                                   bool window_kv) {
  KvCacheSpec s;
  s.num_layers = config.num_layers;
  s.num_kv_heads = config.num_kv_heads;
  s.head_dim = config.head_dim;
  s.block_size = block_size;
  s.dtype = kv_dtype;
  if (window_kv) SetWindowLayout(config.sliding_layers, config.sliding_window, &s);
  return s.bytes_per_block();
}

CpuBackend::CpuBackend(std::shared_ptr<const Model> model, const CpuBackendOptions& options)
    : model_(std::move(model)), options_(options) {}

CpuBackend::~CpuBackend() {
  if (kv_ != nullptr) ::munmap(kv_, kv_bytes_);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(std::shared_ptr<const Model> model,
                                                               const CpuBackendOptions& options) {
  if (options.num_blocks <= 0) return absl::InvalidArgumentError("num_blocks must be > 0");
  if (options.block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (!IsKvDType(options.kv_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU KV cache dtype must be f32, bf16, i8 or f8e4m3, got ",
                     std::string(DTypeName(options.kv_dtype))));
  }
  const bool quantized =
      model->quantization() != WeightQuant::kNone || model->checkpoint_quant().quantized();
  const DType input = options.matmul_input_dtype;
  if ((input == DType::kBF16 && model->weight_dtype() != DType::kBF16 && !quantized) ||
      (input == DType::kI8 && !quantized) ||
      (input != DType::kF32 && input != DType::kBF16 && input != DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatMul input dtype ", std::string(DTypeName(input)),
        ": bf16 inputs need bf16, int8 or int4 weights (--dtype bf16 or --quantization), int8 "
        "inputs int8 or int4 weights; got ",
        std::string(DTypeName(model->weight_dtype())), " weights",
        quantized ? " (quantized)" : ""));
  }
  if (input == DType::kI8 && model->quantization() == WeightQuant::kFp8) {
    return absl::InvalidArgumentError(
        "MatMul input dtype int8 takes int8 or int4 weights, not fp8 (use auto, f32 or bf16)");
  }
  if (quantized && (model->quant_layout() == WeightLayout::kTiles16) != (input == DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized weights with ", std::string(DTypeName(input)),
        " MatMul inputs: the model must be loaded with LoadOptions::quant_layout ",
        input == DType::kI8 ? "kTiles16 (the layout of int8 inputs)" : "kRows", ", it has ",
        model->quant_layout() == WeightLayout::kTiles16 ? "kTiles16" : "kRows"));
  }
  if (model->bf16_layout() == WeightLayout::kTiles16 && input == DType::kF32) {
    return absl::InvalidArgumentError(
        "bf16 weights in the kTiles16 layout take bf16 MatMul inputs, not f32: load the model "
        "with LoadOptions::bf16_layout kRows for f32 inputs");
  }
  const ModelConfig& c = model->config();
  const int64_t longest_row =  // K of every projection
      std::max({c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim});
  if (input == DType::kI8 && longest_row > cpu::kMatMulI8MaxK) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul input dtype i8: rows of up to ",
                                                   cpu::kMatMulI8MaxK, " elements, the model has ",
                                                   longest_row));
  }
  std::unique_ptr<CpuBackend> backend(new CpuBackend(model, options));
  KvCacheSpec& s = backend->spec_;
  s.num_layers = c.num_layers;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.block_size = options.block_size;
  s.dtype = options.kv_dtype;
  s.num_blocks = options.num_blocks;
  if (options.window_kv) SetWindowLayout(c.sliding_layers, c.sliding_window, &s);
  if (s.windowed()) {
    const int64_t groups = s.num_local_groups();
    const size_t n = static_cast<size_t>(groups * s.num_blocks);
    backend->local_map_ = std::make_unique<std::atomic<int32_t>[]>(n);
    for (size_t i = 0; i < n; ++i) backend->local_map_[i].store(-1, std::memory_order_relaxed);
    backend->zero_region_.assign(s.bytes_per_block_layer(), 0);
    backend->local_queries_.resize(groups);
    backend->local_slots_.resize(groups);
  }

  backend->kv_bytes_ = s.bytes_per_block() * static_cast<size_t>(s.num_blocks);
  void* p = ::mmap(nullptr, backend->kv_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", backend->kv_bytes_, " bytes of KV cache"));
  }
  ::madvise(p, backend->kv_bytes_, MADV_HUGEPAGE);
  backend->kv_ = static_cast<uint8_t*>(p);

  backend->max_positions_ = std::min<int64_t>(c.max_position_embeddings, kMaxRopePositions);
  backend->rope_ = RopeCosSinTable(c, backend->max_positions_);
  if (c.rope_local_theta > 0) {  // local layers rotate with their own base and no scaling
    ModelConfig local = c;
    local.rope_theta = c.rope_local_theta;
    local.rope_scaling = RopeScaling();
    backend->rope_local_ = RopeCosSinTable(local, backend->max_positions_);
  }
  int threads = options.num_threads > 0 ? options.num_threads : DefaultComputeThreads();
  backend->pool_ = std::make_unique<ThreadPool>(threads);
  if (options.commit_kv) {
    if (backend->kv_bytes_ >= (size_t{512} << 20)) {  // seconds of work: say what is happening
      TLOG(INFO) << "committing the " << (backend->kv_bytes_ >> 20) << " MiB KV pool";
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status st = CommitPages(backend->kv_, backend->kv_bytes_, backend->pool_.get());
    if (!st.ok()) return st;
    backend->kv_commit_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (options.max_num_tokens > 0) backend->GrowActivations(options.max_num_tokens);
  if (!model->weights().layers.empty()) {
    const cpu::MatMulPath path = cpu::MatMulPathOf(View(model->weights().layers[0].q_proj, input));
    TLOG(INFO) << "cpu kernels: " << cpu::ActiveTierName() << " tier (" << GetCpuFeatures().model
               << ", " << threads << " threads), MatMul inputs " << DTypeName(input)
               << ", projections on " << cpu::MatMulPathName(path)
               << (cpu::MatMulPathTuned(path) ? "" : " (a generic path)");
  }
  return backend;
}

std::vector<std::pair<std::string, std::string>> CpuBackend::InfoLabels() const {
  return {{"simd", cpu::ActiveTierName()},
          {"matmul_input_dtype", std::string(DTypeName(options_.matmul_input_dtype))}};
}

cpu::PagedKvLayer CpuBackend::KvLayer(int64_t layer) const {
  cpu::PagedKvLayer kv;
  const size_t slot = spec_.windowed() ? spec_.layer_slot[layer] : static_cast<size_t>(layer);
  kv.base = kv_ + slot * spec_.bytes_per_block_layer() * static_cast<size_t>(spec_.num_blocks);
  kv.dtype = spec_.dtype;
  kv.block_size = spec_.block_size;
  kv.num_kv_heads = spec_.num_kv_heads;
  kv.head_dim = spec_.head_dim;
  return kv;
}

uint8_t* CpuBackend::HostBlockRegion(int64_t layer, int32_t block) {
  size_t slot = static_cast<size_t>(layer);
  if (spec_.windowed()) {
    slot = spec_.layer_slot[layer];
    if (const int32_t g = spec_.layer_group[layer]; g > 0) {
      block = local_map_[(g - 1) * spec_.num_blocks + block].load(std::memory_order_relaxed);
      // A block outside every window: reads as zeros. Transfers never move such a region (a
      // windowed layer sends and receives only the window's blocks, kvtransfer/transfer_window.h)
      // and WriteBlockRegion refuses it, so nothing writes this shared buffer.
      if (block < 0) return zero_region_.data();
    }
  }
  return kv_ +
         (slot * static_cast<size_t>(spec_.num_blocks) + block) * spec_.bytes_per_block_layer();
}

void CpuBackend::MapLocalPage(int32_t block, int64_t group, int32_t page) {
  if (!spec_.windowed() || group < 1 || group > spec_.num_local_groups()) return;
  local_map_[(group - 1) * spec_.num_blocks + block].store(page, std::memory_order_relaxed);
}

absl::Status CpuBackend::ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) {
  if (layer < 0 || layer >= spec_.num_layers || block < 0 || block >= spec_.num_blocks) {
    return absl::OutOfRangeError(absl::StrCat("KV region (", layer, ", ", block, ") out of range"));
  }
  std::memcpy(dst, HostBlockRegion(layer, block), spec_.bytes_per_block_layer());
  return absl::OkStatus();
}

absl::Status CpuBackend::WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) {
  if (layer < 0 || layer >= spec_.num_layers || block < 0 || block >= spec_.num_blocks) {
    return absl::OutOfRangeError(absl::StrCat("KV region (", layer, ", ", block, ") out of range"));
  }
  uint8_t* region = HostBlockRegion(layer, block);
  if (region == zero_region_.data()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV region (", layer, ", ", block, ") of a local layer is outside every window"));
  }
  std::memcpy(region, src, spec_.bytes_per_block_layer());
  return absl::OkStatus();
}

void CpuBackend::CopyBlock(int32_t src, int32_t dst) {
  const size_t region = spec_.bytes_per_block_layer();
  for (int64_t slot = 0; slot < spec_.slots_per_page(); ++slot) {
    uint8_t* base =
        kv_ + static_cast<size_t>(slot) * static_cast<size_t>(spec_.num_blocks) * region;
    std::memcpy(base + dst * region, base + src * region, region);
  }
}

std::array<CpuBackend::ActivationBuffer, 10> CpuBackend::ActivationBuffers() const {
  const ModelConfig& c = model_->config();
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  return {{{&CpuBackend::x_, d},
           {&CpuBackend::h_, d},
           {&CpuBackend::tmp_, d},
           {&CpuBackend::q_, qd},
           {&CpuBackend::attn_, qd},
           {&CpuBackend::k_, kvd},
           {&CpuBackend::v_, kvd},
           {&CpuBackend::gate_, f},
           {&CpuBackend::up_, f},
           {&CpuBackend::act_, f}}};
}

void CpuBackend::GrowActivations(int64_t t) {
  for (const ActivationBuffer& b : ActivationBuffers()) Grow(this->*b.buffer, t * b.per_token);
  Grow(queries_, t);
}

size_t CpuBackend::activation_bytes() const {
  size_t bytes = queries_.size() * sizeof(cpu::AttentionQuery);
  for (const ActivationBuffer& b : ActivationBuffers()) {
    bytes += (this->*b.buffer).size() * sizeof(float);
  }
  return bytes;
}

absl::Status CpuBackend::Forward(const ForwardBatch& b, float* logits) {
  if (b.remote_kv != nullptr) {
    return absl::UnimplementedError(
        "the CPU backend writes no remote KV pool (zero-copy KV transfers need the CUDA backend)");
  }
  if (auto st = ValidateForwardBatch(b, spec_, model_->config().vocab_size, max_positions_);
      !st.ok()) {
    return st;
  }
  const int64_t t = b.num_tokens();
  if (t == 0) return absl::OkStatus();
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ThreadPool* pool = pool_.get();

  GrowActivations(t);
  float* x = x_.data();
  float* h = h_.data();
  float* q = q_.data();
  float* k = k_.data();
  float* v = v_.data();
  float* attn = attn_.data();
  float* gate = gate_.data();
  float* up = up_.data();
  float* act = act_.data();
  float* delta = tmp_.data();
  cpu::AttentionQuery* queries = queries_.data();
  for (int64_t i = 0; i < t; ++i) {
    queries[i].row = i;
    queries[i].context_len = b.positions[i] + 1;
    queries[i].block_table = b.seqs[b.seq_of_token[i]].block_table.data();
  }
  // Window layout: each local group reads and writes the pages of its own table.
  for (size_t g = 0; g < local_queries_.size(); ++g) {
    cpu::AttentionQuery* lq = Grow(local_queries_[g], t);
    std::vector<int64_t>& ls = local_slots_[g];
    ls.resize(t);
    const int64_t bs = spec_.block_size;
    for (int64_t i = 0; i < t; ++i) {
      const std::vector<int32_t>& table = b.seqs[b.seq_of_token[i]].local_tables[g];
      lq[i] = queries[i];
      lq[i].block_table = table.data();
      ls[i] = static_cast<int64_t>(table[b.positions[i] / bs]) * bs + b.positions[i] % bs;
    }
  }

  auto bias = [](const Tensor& tensor) { return tensor.empty() ? nullptr : tensor.as<float>(); };
  // y[M, N] = in[M, K] . W^T. Act-order int4 weights (Tensor::input_perm) multiply the input
  // gathered by their permutation; consecutive projections of one input (`fresh` false) with the
  // same permutation (q/k/v, gate/up) reuse one gathered copy. A gather is an exact copy of each
  // row on its own, so batch invariance holds.
  const int32_t* gathered = nullptr;
  auto matmul = [&](const float* in, int64_t M, int64_t K, bool fresh, const Tensor& wt, int64_t N,
                    const float* b, float* y) {
    if (fresh) gathered = nullptr;
    const float* src = in;
    if (wt.input_perm != nullptr) {
      float* buf = Grow(permuted_, M * K);
      if (gathered != wt.input_perm) Gather(in, M, K, K, wt.input_perm, buf);
      gathered = wt.input_perm;
      src = buf;
    }
    cpu::MatMul(src, M, K, K, View(wt, options_.matmul_input_dtype), N, b, y, N, pool);
  };
  // Projections of one input (q/k/v, gate/up) in one MatMulShared call when they share their
  // permutation (always, but for act-order checkpoints that differ): one input rounding or
  // quantization and one fork/join instead of one per projection; the same bits as `matmul`.
  struct Proj {
    const Tensor* wt;
    int64_t N;
    const float* b;
    float* y;
  };
  auto matmul_shared = [&](const float* in, int64_t M, int64_t K, std::initializer_list<Proj> ps) {
    bool same_perm = true;
    for (const Proj& p : ps)
      same_perm = same_perm && p.wt->input_perm == ps.begin()->wt->input_perm;
    if (!same_perm) {
      bool fresh = true;
      for (const Proj& p : ps) {
        matmul(in, M, K, fresh, *p.wt, p.N, p.b, p.y);
        fresh = false;
      }
      return;
    }
    const float* src = in;
    if (ps.begin()->wt->input_perm != nullptr) {
      float* buf = Grow(permuted_, M * K);
      Gather(in, M, K, K, ps.begin()->wt->input_perm, buf);
      src = buf;
    }
    std::vector<cpu::MatMulProjection>& out = projections_;  // reused: no allocation per call
    out.clear();
    for (const Proj& p : ps) {
      out.push_back({View(*p.wt, options_.matmul_input_dtype), p.N, p.b, p.y, p.N});
    }
    cpu::MatMulShared(src, M, K, K, out.data(), static_cast<int>(out.size()), pool);
  };

  // LoRA terms (lora.h) are added after each base projection, to the tokens of their adapters.
  lora_.set_bf16_inputs(options_.matmul_input_dtype == DType::kBF16);
  const bool lora = lora_.Prepare(b);
  cpu::Embed(b.token_ids.data(), t, w.embed_tokens.data, w.embed_tokens.dtype, d, x);
  const bool gemma = IsGemma(c.architecture);
  if (gemma) ScaleRows(x, t * d, EmbeddingScale(c, w.embed_tokens.dtype));
  // Attention scores are scaled by 1/sqrt(head_dim) in the kernel; a model asking for another
  // scale (Gemma 3's query_pre_attn_scalar) gets q multiplied by the ratio first.
  const float q_scale =
      c.query_pre_attn_scalar > 0 && c.query_pre_attn_scalar != static_cast<double>(hd)
          ? static_cast<float>(std::sqrt(static_cast<double>(hd) / c.query_pre_attn_scalar))
          : 1.0f;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const bool local = !c.sliding_layers.empty() && c.sliding_layers[l] != 0;
    const int64_t window = c.sliding_layers.empty() ? c.sliding_window
                           : local                  ? c.sliding_window
                                                    : 0;
    const float* rope = local && !rope_local_.empty() ? rope_local_.data() : rope_.data();
    if (l == 0) {
      cpu::RmsNorm(x, lw.input_norm.as<float>(), t, d, eps, h, pool);
    } else {  // x += previous layer's MLP output; h = norm(x)
      cpu::AddRmsNorm(x, delta, lw.input_norm.as<float>(), t, d, eps, h, pool);
    }
    matmul_shared(h, t, d,
                  {{&lw.q_proj, qd, bias(lw.q_bias), q},
                   {&lw.k_proj, kvd, bias(lw.k_bias), k},
                   {&lw.v_proj, kvd, bias(lw.v_bias), v}});
    if (lora) {
      lora_.Add(l, LoraTarget::kQ, h, d, d, q, qd, qd, pool);
      lora_.Add(l, LoraTarget::kK, h, d, d, k, kvd, kvd, pool);
      lora_.Add(l, LoraTarget::kV, h, d, d, v, kvd, kvd, pool);
    }
    if (c.qk_norm) {  // per-head RMSNorm: q and k seen as [t * heads, head_dim] rows
      cpu::RmsNorm(q, lw.q_norm.as<float>(), t * c.num_heads, hd, eps, q, pool);
      cpu::RmsNorm(k, lw.k_norm.as<float>(), t * c.num_kv_heads, hd, eps, k, pool);
    }
    if (c.rope_dim() == hd) {
      cpu::ApplyRope(q, t, qd, c.num_heads, hd, b.positions.data(), rope, pool);
      cpu::ApplyRope(k, t, kvd, c.num_kv_heads, hd, b.positions.data(), rope, pool);
    } else {  // partial rotary: each head's leading rope_dim() dims (one head per call)
      for (int64_t h = 0; h < c.num_heads; ++h) {
        cpu::ApplyRope(q + h * hd, t, qd, 1, c.rope_dim(), b.positions.data(), rope, pool);
      }
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        cpu::ApplyRope(k + h * hd, t, kvd, 1, c.rope_dim(), b.positions.data(), rope, pool);
      }
    }
    if (q_scale != 1.0f) ScaleRows(q, t * qd, q_scale);
    const cpu::PagedKvLayer kv = KvLayer(l);
    const int32_t group = spec_.windowed() ? spec_.layer_group[l] : 0;
    const int64_t* slots = group > 0 ? local_slots_[group - 1].data() : b.slots.data();
    const cpu::AttentionQuery* layer_queries =
        group > 0 ? local_queries_[group - 1].data() : queries;
    cpu::WriteKv(k, kvd, v, kvd, t, slots, kv, pool);
    cpu::PagedAttention(q, qd, layer_queries, t, c.num_heads, kv, window, attn, qd, pool,
                        static_cast<float>(c.attn_logit_softcapping));
    if (b.on_layer_done) b.on_layer_done(l);
    matmul(attn, t, qd, true, lw.o_proj, d, nullptr, delta);
    if (lora) lora_.Add(l, LoraTarget::kO, attn, qd, qd, delta, d, d, pool);
    if (gemma) {  // norm the attention output, add it, norm again before the MLP
      cpu::RmsNorm(delta, lw.post_norm.as<float>(), t, d, eps, delta, pool);
      cpu::AddRmsNorm(x, delta, lw.pre_ffw_norm.as<float>(), t, d, eps, h, pool);
    } else {
      cpu::AddRmsNorm(x, delta, lw.post_norm.as<float>(), t, d, eps, h, pool);
    }
    if (c.num_experts > 0) {  // experts batched by expert (moe.h)
      moe_->Run(c, lw, h, t, options_.matmul_input_dtype, delta, pool);
      continue;
    }
    matmul_shared(h, t, d, {{&lw.gate_proj, f, nullptr, gate}, {&lw.up_proj, f, nullptr, up}});
    if (lora) {
      lora_.Add(l, LoraTarget::kGate, h, d, d, gate, f, f, pool);
      lora_.Add(l, LoraTarget::kUp, h, d, d, up, f, f, pool);
    }
    if (c.activation == Activation::kGeluTanh) {
      GeluTanhMul(gate, up, t * f, act, pool);
    } else {
      cpu::SiluMul(gate, up, t, f, act, pool);
    }
    matmul(act, t, f, true, lw.down_proj, d, nullptr, delta);
    if (lora) lora_.Add(l, LoraTarget::kDown, act, f, f, delta, d, d, pool);
    if (gemma) cpu::RmsNorm(delta, lw.post_ffw_norm.as<float>(), t, d, eps, delta, pool);
  }

  // Final residual add and norm, only for the rows whose logits are wanted.
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  if (n == 0) return absl::OkStatus();
  float* rows = Grow(final_, 3 * n * d);
  float* rows_delta = rows + n * d;
  float* rows_norm = rows + 2 * n * d;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(rows + i * d, x + b.logit_rows[i] * d, d * sizeof(float));
    std::memcpy(rows_delta + i * d, delta + b.logit_rows[i] * d, d * sizeof(float));
  }
  cpu::AddRmsNorm(rows, rows_delta, w.final_norm.as<float>(), n, d, eps, rows_norm);
  matmul(rows_norm, n, d, true, w.lm_head, c.vocab_size, nullptr, logits);
  if (c.final_logit_softcapping > 0) {
    const float cap = static_cast<float>(c.final_logit_softcapping);
    for (int64_t i = 0; i < n * c.vocab_size; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return absl::OkStatus();
}

}  // namespace tandem
