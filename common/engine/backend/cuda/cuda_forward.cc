// CUDA backend: the forward pass (eager, or replayed from CUDA graphs for decode steps).

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kMinContextBucket = 512;
constexpr size_t kMaxGraphs = 256;

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

#define TANDEM_LAUNCH_OR_RETURN(expr, name) TANDEM_CUDA_RETURN_IF_ERROR(expr, name " kernel launch")

}  // namespace

bool CudaBackend::GraphEligible(const ForwardBatch& b) const {
  if (!options_.cuda_graphs || !graphs_enabled_ || b.on_layer_done || batch_buckets_.empty()) {
    return false;
  }
  const int64_t t = b.num_tokens();
  if (t > batch_buckets_.back()) return false;
  if (static_cast<int64_t>(b.seqs.size()) != t || static_cast<int64_t>(b.logit_rows.size()) != t) {
    return false;
  }
  for (int64_t i = 0; i < t; ++i) {
    if (b.seqs[i].num_tokens != 1 || b.seqs[i].token_begin != i || b.logit_rows[i] != i) {
      return false;
    }
  }
  return graphs_.size() < kMaxGraphs;  // new buckets are captured while there is room
}

absl::Status CudaBackend::Forward(const ForwardBatch& b, float* logits) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  if (!sticky_.ok()) return sticky_;
  TANDEM_RETURN_IF_ERROR(
      ValidateForwardBatch(b, spec_, model_->config().vocab_size, max_positions_));
  if (b.num_tokens() == 0) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  if (GraphEligible(b)) {
    absl::Status st = ForwardGraph(b);
    if (st.ok()) {
      ++graph_steps_;
      return FinishStep(n, logits);
    }
    TLOG(WARNING) << "CUDA graphs disabled, running eagerly: " << st;
    graphs_enabled_ = false;
    DropGraphs();
  }
  TANDEM_RETURN_IF_ERROR(ForwardEager(b));
  ++eager_steps_;
  return FinishStep(n, logits);
}

absl::Status CudaBackend::ForwardEager(const ForwardBatch& b) {
  const int64_t t = b.num_tokens(), s = static_cast<int64_t>(b.seqs.size());
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(t, s, n));
  const InputLayout& L = layout_;
  std::vector<int32_t> context_lens(t);
  for (int64_t i = 0; i < t; ++i) context_lens[i] = b.positions[i] + 1;
  std::memcpy(Staged<int32_t>(L.tokens), b.token_ids.data(), t * sizeof(int32_t));
  std::memcpy(Staged<int32_t>(L.positions), b.positions.data(), t * sizeof(int32_t));
  std::memcpy(Staged<int32_t>(L.context_lens), context_lens.data(), t * sizeof(int32_t));
  std::memcpy(Staged<int32_t>(L.logit_rows), b.logit_rows.data(), n * sizeof(int32_t));
  std::memcpy(Staged<int64_t>(L.slots), b.slots.data(), t * sizeof(int64_t));

  // Block tables: each sequence's blocks up to its last position in this step.
  std::vector<int32_t> needed(s, 0);
  int32_t stride = 1;
  for (int64_t q = 0; q < s; ++q) {
    const ForwardSeq& seq = b.seqs[q];
    for (int32_t i = seq.token_begin; i < seq.token_begin + seq.num_tokens; ++i) {
      needed[q] = std::max<int32_t>(needed[q], b.positions[i] / spec_.block_size + 1);
    }
    stride = std::max(stride, needed[q]);
  }
  int32_t* tables = Staged<int32_t>(L.tables);
  for (int64_t q = 0; q < s; ++q) {
    int32_t* row = tables + q * stride;
    std::copy(b.seqs[q].block_table.begin(), b.seqs[q].block_table.begin() + needed[q], row);
    std::fill(row + needed[q], row + stride, 0);
  }

  const AttentionPlan plan = PlanAttention(
      b, context_lens, static_cast<int32_t>(model_->config().sliding_window), plan_options_);
  if (static_cast<int64_t>(plan.items.size()) > cap_items_) {
    return absl::InternalError("attention plan exceeds its buffer");
  }
  std::copy(plan.items.begin(), plan.items.end(), Staged<AttentionItem>(L.items));
  std::copy(plan.combines.begin(), plan.combines.end(), Staged<CombineItem>(L.combines));

  auto upload = [&](size_t offset, size_t bytes) -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(Input<uint8_t>(offset), Staged<uint8_t>(offset),
                                                bytes, cudaMemcpyHostToDevice, stream_),
                                "cudaMemcpyAsync (step inputs)");
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(upload(0, L.head_end));
  TANDEM_RETURN_IF_ERROR(upload(L.tables, s * stride * sizeof(int32_t)));
  TANDEM_RETURN_IF_ERROR(upload(L.items, plan.items.size() * sizeof(AttentionItem)));
  TANDEM_RETURN_IF_ERROR(upload(L.combines, plan.combines.size() * sizeof(CombineItem)));

  StepShape shape;
  shape.tokens = t;
  shape.logit_rows = n;
  shape.gather = true;
  shape.table_stride = stride;
  shape.items = Input<AttentionItem>(L.items);
  shape.num_items = static_cast<int32_t>(plan.items.size());
  shape.max_tile_rows = plan.max_tile_rows;
  shape.combines = Input<CombineItem>(L.combines);
  shape.num_combines = static_cast<int32_t>(plan.combines.size());
  return Enqueue(shape, b.on_layer_done);
}

absl::Status CudaBackend::ForwardGraph(const ForwardBatch& b) {
  const int64_t t = b.num_tokens();
  const int batch = *std::lower_bound(batch_buckets_.begin(), batch_buckets_.end(), t);
  int64_t max_context = 1;
  for (int32_t p : b.positions) max_context = std::max<int64_t>(max_context, p + 1);
  const int bucket = static_cast<int>(std::max<int64_t>(kMinContextBucket, NextPow2(max_context)));
  const int32_t stride = static_cast<int32_t>((bucket + spec_.block_size - 1) / spec_.block_size);
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(batch, batch, batch));
  const InputLayout& L = layout_;

  // Padding rows: token 0 at position 0 with no context and no KV slot.
  int32_t* tokens = Staged<int32_t>(L.tokens);
  int32_t* positions = Staged<int32_t>(L.positions);
  int32_t* context_lens = Staged<int32_t>(L.context_lens);
  int32_t* rows = Staged<int32_t>(L.logit_rows);
  int64_t* slots = Staged<int64_t>(L.slots);
  int32_t* tables = Staged<int32_t>(L.tables);
  for (int64_t i = 0; i < batch; ++i) {
    const bool real = i < t;
    tokens[i] = real ? b.token_ids[i] : 0;
    positions[i] = real ? b.positions[i] : 0;
    context_lens[i] = real ? b.positions[i] + 1 : 0;
    rows[i] = static_cast<int32_t>(i);
    slots[i] = real ? b.slots[i] : -1;
    int32_t* row = tables + i * stride;
    const int32_t needed = real ? b.positions[i] / static_cast<int32_t>(spec_.block_size) + 1 : 0;
    if (real) std::copy(b.seqs[i].block_table.begin(), b.seqs[i].block_table.begin() + needed, row);
    std::fill(row + needed, row + stride, 0);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(inputs_.get(), staging_.get(), L.head_end, cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (step inputs)");
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(Input<uint8_t>(L.tables), Staged<uint8_t>(L.tables),
                      batch * stride * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (block tables)");

  const std::pair<int, int> key(batch, bucket);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    Graph graph;
    TANDEM_RETURN_IF_ERROR(CaptureGraph(batch, bucket, stride, &graph));
    it = graphs_.emplace(key, std::move(graph)).first;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec, stream_), "cudaGraphLaunch");
  return absl::OkStatus();
}

absl::Status CudaBackend::CaptureGraph(int batch, int context_bucket, int32_t table_stride,
                                       Graph* graph) {
  const AttentionPlan plan = PlanDecodeGraph(batch, context_bucket, plan_options_);
  const size_t items_bytes = AlignUp256(plan.items.size() * sizeof(AttentionItem));
  const size_t combines_bytes = plan.combines.size() * sizeof(CombineItem);
  TANDEM_RETURN_IF_ERROR(
      graph->plan.Allocate(items_bytes + combines_bytes, "graph attention plan"));
  uint8_t* base = graph->plan.as<uint8_t>();
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(base, plan.items.data(), plan.items.size() * sizeof(AttentionItem),
                      cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (graph plan)");
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + items_bytes, plan.combines.data(),
                                              combines_bytes, cudaMemcpyHostToDevice, stream_),
                              "cudaMemcpyAsync (graph plan)");
  // The plan's host vectors die with this function.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (graph plan)");

  StepShape shape;
  shape.tokens = batch;
  shape.logit_rows = batch;
  shape.gather = false;
  shape.table_stride = table_stride;
  shape.items = reinterpret_cast<const AttentionItem*>(base);
  shape.num_items = static_cast<int32_t>(plan.items.size());
  shape.max_tile_rows = plan.max_tile_rows;
  shape.combines = reinterpret_cast<const CombineItem*>(base + items_bytes);
  shape.num_combines = static_cast<int32_t>(plan.combines.size());

  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture");
  const absl::Status enqueued = Enqueue(shape, {});
  cudaGraph_t captured = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &captured);
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (captured != nullptr) cudaGraphDestroy(captured);
    cudaGetLastError();
    return enqueued.ok() ? CudaStatus(ended, "cudaStreamEndCapture") : enqueued;
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&graph->exec, captured, 0);
  cudaGraphDestroy(captured);
  TANDEM_CUDA_RETURN_IF_ERROR(instantiated, "cudaGraphInstantiate");
  return absl::OkStatus();
}

absl::Status CudaBackend::Enqueue(const StepShape& shape,
                                  const std::function<void(int64_t)>& on_layer_done) {
  const ModelConfig& c = model_->config();
  const int64_t t = shape.tokens;
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd, qkvd = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const InputLayout& L = layout_;
  const int32_t* positions = Input<int32_t>(L.positions);
  const float* rope = rope_.as<float>();
  const DeviceMatrix& embed = weights_->embed();

  TANDEM_LAUNCH_OR_RETURN(
      Embed(Input<int32_t>(L.tokens), t, embed.data, embed.dtype == DType::kBF16, d, x_, stream_),
      "Embed");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = weights_->layers()[l];
    if (l == 0) {
      TANDEM_LAUNCH_OR_RETURN(RmsNorm(x_, w.input_norm, t, d, eps, h_, stream_), "RmsNorm");
    } else {  // x += previous layer's MLP output; h = norm(x)
      TANDEM_LAUNCH_OR_RETURN(AddRmsNorm(x_, delta_, w.input_norm, t, d, eps, h_, stream_),
                              "AddRmsNorm");
    }
    TANDEM_RETURN_IF_ERROR(gemm_->Run(h_, t, d, w.qkv, w.qkv_bias, qkv_, qkvd));
    TANDEM_LAUNCH_OR_RETURN(
        Rope(qkv_, t, qkvd, c.num_heads + c.num_kv_heads, hd, positions, rope, stream_), "Rope");
    const KvLayerView kv = KvLayer(l);
    TANDEM_LAUNCH_OR_RETURN(
        WriteKv(qkv_ + qd, qkvd, qkv_ + qd + kvd, qkvd, t, Input<int64_t>(L.slots), kv, stream_),
        "WriteKv");
    AttentionArgs a;
    a.q = qkv_;
    a.ldq = qkvd;
    a.out = attn_;
    a.ldo = qd;
    a.num_heads = static_cast<int32_t>(c.num_heads);
    a.kv = kv;
    a.block_tables = Input<int32_t>(L.tables);
    a.table_stride = shape.table_stride;
    a.context_lens = Input<int32_t>(L.context_lens);
    a.sliding_window = static_cast<int32_t>(c.sliding_window);
    a.items = shape.items;
    a.num_items = shape.num_items;
    a.max_tile_rows = shape.max_tile_rows;
    a.combines = shape.combines;
    a.num_combines = shape.num_combines;
    a.partial_out = partial_.as<float>();
    a.partial_ml = partial_.as<float>() + static_cast<int64_t>(plan_options_.max_partial_slots) *
                                              kMaxAttentionSplits * c.num_heads * hd;
    TANDEM_LAUNCH_OR_RETURN(PagedAttention(a, stream_), "PagedAttention");
    if (on_layer_done) {  // the hook may read this layer's KV (ReadBlockRegion syncs too)
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (layer)");
      on_layer_done(l);
    }
    TANDEM_RETURN_IF_ERROR(gemm_->Run(attn_, t, qd, w.o, nullptr, delta_, d));
    TANDEM_LAUNCH_OR_RETURN(AddRmsNorm(x_, delta_, w.post_norm, t, d, eps, h_, stream_),
                            "AddRmsNorm");
    TANDEM_RETURN_IF_ERROR(gemm_->Run(h_, t, d, w.gate_up, nullptr, gate_up_, 2 * f));
    TANDEM_LAUNCH_OR_RETURN(SiluMul(gate_up_, 2 * f, t, f, mlp_, stream_), "SiluMul");
    TANDEM_RETURN_IF_ERROR(gemm_->Run(mlp_, t, f, w.down, nullptr, delta_, d));
  }

  // Final residual add and norm, only for the rows whose logits are wanted.
  const int64_t n = shape.logit_rows;
  if (n == 0) return absl::OkStatus();
  if (shape.gather) {
    const int32_t* rows = Input<int32_t>(L.logit_rows);
    TANDEM_LAUNCH_OR_RETURN(GatherRows(x_, d, rows, n, d, rows_x_, stream_), "GatherRows");
    TANDEM_LAUNCH_OR_RETURN(GatherRows(delta_, d, rows, n, d, rows_delta_, stream_), "GatherRows");
    TANDEM_LAUNCH_OR_RETURN(
        AddRmsNorm(rows_x_, rows_delta_, weights_->final_norm(), n, d, eps, rows_norm_, stream_),
        "AddRmsNorm");
  } else {
    TANDEM_LAUNCH_OR_RETURN(
        AddRmsNorm(x_, delta_, weights_->final_norm(), n, d, eps, rows_norm_, stream_),
        "AddRmsNorm");
  }
  return gemm_->Run(rows_norm_, n, d, weights_->lm_head(), nullptr, logits_, c.vocab_size);
}

absl::Status CudaBackend::FinishStep(int64_t logit_rows, float* logits) {
  const size_t bytes =
      static_cast<size_t>(logit_rows * model_->config().vocab_size) * sizeof(float);
  cudaError_t err = cudaSuccess;
  if (bytes > 0) {
    err = cudaMemcpyAsync(logits_host_.get(), logits_, bytes, cudaMemcpyDeviceToHost, stream_);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) {
    // Kernel faults surface here and leave the context unusable: fail every later step too.
    sticky_ = CudaStatus(err, "CUDA forward pass");
    return sticky_;
  }
  if (bytes > 0) std::memcpy(logits, logits_host_.get(), bytes);
  return absl::OkStatus();
}

void CudaBackend::DropGraphs() {
  for (auto& [key, graph] : graphs_) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
  }
  graphs_.clear();
}

}  // namespace tandem::cuda
