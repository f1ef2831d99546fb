// CUDA backend: the forward pass. A step is staged on the host (inputs padded to its graph
// buckets, attention plan, block tables) and uploaded, then either replayed from two CUDA graphs
// (the layers for the token bucket, the logits for the row bucket) or enqueued eagerly; the
// logits come back (or are sampled on the device, cuda_sampling.cc) through the step's slot and
// its event: LaunchStep / CollectStep (cuda_sampling.cc), the one place that waits for the
// device.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

#define TANDEM_LAUNCH_OR_RETURN(expr, name) TANDEM_CUDA_RETURN_IF_ERROR(expr, name " kernel launch")

int Bucket(const std::vector<int>& buckets, int64_t n) {
  return *std::lower_bound(buckets.begin(), buckets.end(), n);
}

}  // namespace

static_assert(kKvRemoteBlock == tandem::kKvRemoteBlock, "one tag for remote KV blocks");

bool CudaBackend::GraphEligible(const ForwardBatch& b) const {
  // A step writing a remote pool runs eagerly: the graphs hold no remote base.
  if (!graphs_enabled_ || buckets_.empty() || b.on_layer_done || b.remote_kv) return false;
  const int64_t max = buckets_.back();
  return b.num_tokens() <= max && static_cast<int64_t>(b.logit_rows.size()) <= max;
}

absl::Status CudaBackend::Forward(const ForwardBatch& b, float* logits) {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError("Forward while a launched step is not collected");
  }
  TANDEM_RETURN_IF_ERROR(LaunchStep(b, {}, {}));
  std::vector<DeviceSample> none;
  return CollectStep(logits, &none);
}

absl::Status CudaBackend::EnqueueStep(const ForwardBatch& b,
                                      const std::vector<DeviceTokenInput>& device_tokens,
                                      const SampleOutput* prev_samples) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  if (!sticky_.ok()) return sticky_;
  TANDEM_RETURN_IF_ERROR(
      ValidateForwardBatch(b, spec_, model_->config().vocab_size, max_positions_));
  const int64_t t = b.num_tokens(), s = static_cast<int64_t>(b.seqs.size());
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  if (t == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(t, s, n));
  TANDEM_RETURN_IF_ERROR(PrepareSlot());
  if (graphs_stale_ && graphs_enabled_) {
    graphs_stale_ = false;
    if (absl::Status st = CaptureGraphs(); !st.ok()) {
      TLOG(WARNING) << "CUDA graphs disabled, running eagerly: " << st;
      graphs_enabled_ = false;
      DropGraphs();
    }
  }
  // LoRA steps run eagerly (the graphs hold no LoRA products); every step first frees the slots
  // of adapters that are gone (device_lora.h).
  absl::StatusOr<bool> lora = false;
  if (lora_ != nullptr) {
    lora = lora_->Prepare(b, cur_, t, stream_);
    if (!lora.ok()) return lora.status();
  } else if (std::any_of(b.seqs.begin(), b.seqs.end(),
                         [](const ForwardSeq& s) { return s.lora != nullptr; })) {
    return absl::FailedPreconditionError(
        "a LoRA adapter on a CUDA backend made without LoRA slots "
        "(CudaBackendOptions::lora_slots)");
  }
  if (!*lora && GraphEligible(b)) {
    const int tokens = Bucket(buckets_, t), rows = n == 0 ? 0 : Bucket(buckets_, n);
    absl::StatusOr<StepShape> shape = Stage(b, device_tokens, prev_samples, tokens, rows, true);
    if (!shape.ok()) return shape.status();
    cudaError_t err = cudaGraphLaunch(body_graphs_.at(tokens).exec, stream_);
    if (err == cudaSuccess && rows > 0) err = cudaGraphLaunch(head_graphs_.at(rows).exec, stream_);
    if (err == cudaSuccess) {
      ++graph_steps_;
      return absl::OkStatus();
    }
    // A launch that fails leaves nothing enqueued; what did launch is idempotent given the inputs.
    cudaGetLastError();
    TLOG(WARNING) << "CUDA graphs disabled, running eagerly: "
                  << CudaStatus(err, "cudaGraphLaunch");
    graphs_enabled_ = false;
    DropGraphs();
  }
  absl::StatusOr<StepShape> shape = Stage(b, device_tokens, prev_samples, t, n, false);
  if (!shape.ok()) return shape.status();
  step_remote_ = b.remote_kv.get();
  absl::Status enqueued = EnqueueLayers(*shape, b.on_layer_done, *lora);
  step_remote_ = nullptr;
  TANDEM_RETURN_IF_ERROR(enqueued);
  TANDEM_RETURN_IF_ERROR(EnqueueLogits(*shape));
  ++eager_steps_;
  return absl::OkStatus();
}

CudaBackend::StepShape CudaBackend::GraphShape(int64_t tokens, int64_t logit_rows) const {
  StepShape shape;
  shape.tokens = tokens;
  shape.logit_rows = logit_rows;
  shape.layout = Layout(tokens);
  // Enough blocks along the items to fill the device about four times over; each loops over
  // the step's items (fewer items leave blocks idle, more make each block take several).
  const int64_t want =
      (4 * static_cast<int64_t>(plan_options_.target_blocks) + plan_options_.kv_heads - 1) /
      plan_options_.kv_heads;
  shape.grid_items = static_cast<int32_t>(std::clamp<int64_t>(want, 1, ItemsCapacity(tokens)));
  shape.grid_combines =
      static_cast<int32_t>(std::min<int64_t>(tokens, plan_options_.max_partial_slots));
  shape.max_tile_rows = plan_options_.max_tile_tokens * plan_options_.group;
  return shape;
}

absl::StatusOr<CudaBackend::StepShape> CudaBackend::Stage(
    const ForwardBatch& b, const std::vector<DeviceTokenInput>& device_tokens,
    const SampleOutput* prev_samples, int64_t tokens, int64_t logit_rows, bool graph) {
  const int64_t t = b.num_tokens(), s = static_cast<int64_t>(b.seqs.size());
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  StepShape shape = graph ? GraphShape(tokens, logit_rows) : StepShape{};
  if (!graph) {
    shape.tokens = tokens;
    shape.logit_rows = logit_rows;
    shape.layout = Layout(tokens);
  }
  const InputLayout& L = shape.layout;

  // Per-token inputs; rows past the step's tokens (a graph's padding) are token 0 at position 0
  // with no context and no KV slot.
  int32_t* token_ids = Staged<int32_t>(L.tokens);
  int32_t* positions = Staged<int32_t>(L.positions);
  int32_t* context_lens = Staged<int32_t>(L.context_lens);
  int64_t* slots = Staged<int64_t>(L.slots);
  std::copy(b.token_ids.begin(), b.token_ids.end(), token_ids);
  std::copy(b.positions.begin(), b.positions.end(), positions);
  std::copy(b.slots.begin(), b.slots.end(), slots);
  for (int64_t i = 0; i < t; ++i) context_lens[i] = b.positions[i] + 1;
  std::fill(token_ids + t, token_ids + tokens, 0);
  std::fill(positions + t, positions + tokens, 0);
  std::fill(context_lens + t, context_lens + tokens, 0);
  std::fill(slots + t, slots + tokens, -1);
  int32_t* rows = Staged<int32_t>(L.rows);
  std::copy(b.logit_rows.begin(), b.logit_rows.end(), rows);
  std::fill(rows + n, rows + logit_rows, 0);

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

  const std::vector<int32_t> lens(context_lens, context_lens + t);
  // Tiles on tensor cores (q, K, V and the softmax weights in bf16) in the bf16-activation mode
  // only; the f32 parity mode keeps f32 attention.
  AttentionPlanOptions plan_options = plan_options_;
  plan_options.mma_tiles = plan_options.mma_tiles && act_bf16_;
  const AttentionPlan plan =
      PlanAttention(b, lens, static_cast<int32_t>(model_->config().sliding_window), plan_options);
  if (static_cast<int64_t>(plan.items.size()) > ItemsCapacity(tokens) ||
      static_cast<int64_t>(plan.combines.size()) >
          std::min<int64_t>(tokens, plan_options_.max_partial_slots)) {
    return absl::InternalError("attention plan exceeds its buffer");
  }
  std::copy(plan.items.begin(), plan.items.end(), Staged<AttentionItem>(L.items));
  std::copy(plan.combines.begin(), plan.combines.end(), Staged<CombineItem>(L.combines));
  AttentionCounts* counts = Staged<AttentionCounts>(L.counts);
  *counts = AttentionCounts{};
  counts->num_items = static_cast<int32_t>(plan.items.size());
  counts->num_combines = static_cast<int32_t>(plan.combines.size());
  counts->table_stride = stride;
  if (!graph) {
    shape.grid_items = counts->num_items;
    shape.grid_combines = counts->num_combines;
    shape.max_tile_rows = plan.max_tile_rows;
  }

  // Input tokens sampled by the previous step on the device: (token index, sample index) pairs
  // after the block tables.
  const size_t pairs_at = AlignUp256(L.tables + s * stride * sizeof(int32_t));
  const int64_t num_pairs = static_cast<int64_t>(device_tokens.size());
  int32_t* pairs = Staged<int32_t>(pairs_at);
  for (int64_t i = 0; i < num_pairs; ++i) {
    pairs[2 * i] = device_tokens[i].token_index;
    pairs[2 * i + 1] = device_tokens[i].sample_index;
  }

  // Two copies: everything up to the last item, then the merges, the block tables and the pairs.
  auto upload = [&](size_t begin, size_t end) -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(Input<uint8_t>(begin), Staged<uint8_t>(begin),
                                                end - begin, cudaMemcpyHostToDevice, stream_),
                                "cudaMemcpyAsync (step inputs)");
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(upload(0, L.items + plan.items.size() * sizeof(AttentionItem)));
  TANDEM_RETURN_IF_ERROR(upload(L.combines, num_pairs > 0
                                                ? pairs_at + num_pairs * 2 * sizeof(int32_t)
                                                : L.tables + s * stride * sizeof(int32_t)));
  if (num_pairs > 0) {
    TANDEM_LAUNCH_OR_RETURN(GatherSampledTokens(prev_samples, Input<int32_t>(pairs_at), num_pairs,
                                                Input<int32_t>(L.tokens), stream_),
                            "GatherSampledTokens");
    device_input_tokens_ += num_pairs;
  }
  return shape;
}

absl::Status CudaBackend::CaptureGraphs() {
  DropGraphs();
  for (int bucket : buckets_) {
    Graph body, head;
    TANDEM_RETURN_IF_ERROR(Capture(true, bucket, &body));
    body_graphs_.emplace(bucket, body);
    TANDEM_RETURN_IF_ERROR(Capture(false, bucket, &head));
    head_graphs_.emplace(bucket, head);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Capture(bool body, int bucket, Graph* graph) {
  const StepShape shape = GraphShape(bucket, bucket);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture");
  const absl::Status enqueued = body ? EnqueueLayers(shape, {}) : EnqueueLogits(shape);
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

absl::Status CudaBackend::EnqueueLayers(const StepShape& shape,
                                        const std::function<void(int64_t)>& on_layer_done,
                                        bool lora) {
  const ModelConfig& c = model_->config();
  const int64_t t = shape.tokens;
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t qkvd = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const InputLayout& L = shape.layout;
  const int32_t* positions = Input<int32_t>(L.positions);
  const DeviceMatrix& embed = weights_->embed();
  const std::vector<DeviceLayer>& layers = weights_->layers();
  const bool bf16 = act_bf16_;

  TANDEM_LAUNCH_OR_RETURN(
      EmbedRmsNorm(Input<int32_t>(L.tokens), t, embed.data, embed.dtype == DType::kBF16, d,
                   layers[0].input_norm, eps, x_, h_, bf16, stream_),
      "EmbedRmsNorm");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = layers[l];
    if (l > 0) {  // x += previous layer's MLP output; h = norm(x)
      TANDEM_LAUNCH_OR_RETURN(AddRmsNorm(x_, delta_, w.input_norm, t, d, eps, h_, bf16, stream_),
                              "AddRmsNorm");
    }
    TANDEM_RETURN_IF_ERROR(gemm_->Run({h_, bf16, d}, t, w.qkv, qkv_, qkvd));
    if (lora) {  // LoRA terms (device_lora.h) after each base product, before bias and RoPE
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kQ, {h_, bf16, d}, d, qkv_, qkvd, qd, stream_));
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kK, {h_, bf16, d}, d, qkv_ + qd, qkvd, kvd, stream_));
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kV, {h_, bf16, d}, d, qkv_ + qd + kvd, qkvd, kvd, stream_));
    }
    const KvLayerView kv = KvLayer(l);
    TANDEM_LAUNCH_OR_RETURN(RopeWriteKv(qkv_, qkvd, t, c.num_heads, positions, rope_.as<float>(),
                                        w.qkv_bias, Input<int64_t>(L.slots), kv, stream_),
                            "RopeWriteKv");
    if (on_layer_done) {  // the layer's KV is written: its export waits for this on the device
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(layer_events_[l], stream_),
                                  "cudaEventRecord (kv layer)");
      on_layer_done(l);
    }
    AttentionArgs a;
    a.q = qkv_;
    a.ldq = qkvd;
    a.out = attn_;
    a.ldo = qd;
    a.out_bf16 = bf16;
    a.num_heads = static_cast<int32_t>(c.num_heads);
    a.kv = kv;
    a.block_tables = Input<int32_t>(L.tables);
    a.context_lens = Input<int32_t>(L.context_lens);
    a.sliding_window = static_cast<int32_t>(c.sliding_window);
    a.counts = Input<AttentionCounts>(L.counts);
    a.items = Input<AttentionItem>(L.items);
    a.combines = Input<CombineItem>(L.combines);
    a.grid_items = shape.grid_items;
    a.grid_combines = shape.grid_combines;
    a.max_tile_rows = shape.max_tile_rows;
    a.partial_out = partial_.as<float>();
    a.partial_ml = partial_.as<float>() + static_cast<int64_t>(plan_options_.max_partial_slots) *
                                              kMaxAttentionSplits * c.num_heads * c.head_dim;
    TANDEM_LAUNCH_OR_RETURN(PagedAttention(a, stream_), "PagedAttention");
    TANDEM_RETURN_IF_ERROR(gemm_->Run({attn_, bf16, qd}, t, w.o, delta_, d));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kO, {attn_, bf16, qd}, qd, delta_, d, d, stream_));
    }
    TANDEM_LAUNCH_OR_RETURN(AddRmsNorm(x_, delta_, w.post_norm, t, d, eps, h_, bf16, stream_),
                            "AddRmsNorm");
    if (lora) {  // gate and up apart (their LoRA terms before the SiLU), then SiluMul
      TANDEM_RETURN_IF_ERROR(gemm_->Run({h_, bf16, d}, t, w.gate_up, gate_up_, 2 * f));
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kGate, {h_, bf16, d}, d, gate_up_, 2 * f, f, stream_));
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kUp, {h_, bf16, d}, d, gate_up_ + f, 2 * f, f, stream_));
      TANDEM_LAUNCH_OR_RETURN(SiluMul(gate_up_, 2 * f, t, f, mlp_, bf16, stream_), "SiluMul");
    } else {
      TANDEM_RETURN_IF_ERROR(gemm_->RunSiluMul({h_, bf16, d}, t, w.gate_up, gate_up_, mlp_, bf16));
    }
    TANDEM_RETURN_IF_ERROR(gemm_->Run({mlp_, bf16, f}, t, w.down, delta_, d));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(
          lora_->Add(l, LoraTarget::kDown, {mlp_, bf16, f}, f, delta_, d, d, stream_));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::EnqueueLogits(const StepShape& shape) {
  const ModelConfig& c = model_->config();
  const int64_t n = shape.logit_rows, d = c.hidden_size;
  if (n == 0) return absl::OkStatus();
  TANDEM_LAUNCH_OR_RETURN(
      GatherAddRmsNorm(x_, delta_, d, Input<int32_t>(shape.layout.rows), n, d,
                       weights_->final_norm(), static_cast<float>(c.rms_norm_eps), rows_norm_,
                       act_bf16_, stream_),
      "GatherAddRmsNorm");
  return gemm_->Run({rows_norm_, act_bf16_, d}, n, weights_->lm_head(), logits_, c.vocab_size);
}

void CudaBackend::DropGraphs() {
  for (auto* graphs : {&body_graphs_, &head_graphs_}) {
    for (auto& [key, graph] : *graphs) {
      if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
    }
    graphs->clear();
  }
}

}  // namespace tandem::cuda
